"""Support for the browser tests: headless Debian Chromium driven by Playwright, with a fake
microphone playing a WAV file, and the server on the ``tiny`` engine (a seeded torch frame
model: it answers every 80 ms frame with audio and, on some frames, a letter of text, so the
page shows an agent transcript and plays agent audio within a second, with no model files).

Playwright cannot download its own browsers here: it drives the system's
``/usr/bin/chromium`` (``apt-get install chromium``, in the Makefile's APT_PACKAGES); the
tests skip, saying so, where it is absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import wave
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rtserve.config import ServerConfig

CHROMIUM = Path("/usr/bin/chromium")
HANG_GUARD_S = 20.0

playwright_api = pytest.importorskip("playwright.async_api", reason="playwright is in the dev extra")
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"{CHROMIUM} is absent (apt-get install chromium; make test does)"
)


def chromium_flags(wav: Path) -> list[str]:
    # Loopback candidates and raw 127.0.0.1 addresses (no mDNS names): ICE stays on this host.
    return [
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={wav}",
        "--allow-loopback-in-peer-connection",
        "--disable-features=WebRtcHideLocalIpsWithMdns",
        "--autoplay-policy=no-user-gesture-required",
    ]


def write_voice_wav(path: Path, seconds: float = 3.0, rate: int = 48000) -> Path:
    """A speech-loud fake microphone: a 220 Hz tone with a 3 Hz syllable envelope."""
    t = np.arange(int(seconds * rate)) / rate
    signal = 0.4 * np.sin(2 * np.pi * 220 * t) * (0.55 + 0.45 * np.sin(2 * np.pi * 3 * t))
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((signal * 32767).astype(np.int16).tobytes())
    return path


def tiny_config(config: ServerConfig) -> ServerConfig:
    config.engine = "tiny"
    config.lockstep.batch_size = 2
    return config


@contextlib.asynccontextmanager
async def chromium(wav: Path) -> AsyncIterator[Any]:
    """A fresh headless Chromium (one browser context); closed on exit."""
    async with playwright_api.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=chromium_flags(wav))
        try:
            context = await browser.new_context()
            yield context
        finally:
            await browser.close()


async def until(page: Any, expression: str, *, timeout_s: float = HANG_GUARD_S, what: str = "") -> Any:
    """Evaluate ``expression`` in the page every 100 ms until it is truthy; its value."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = await page.evaluate(expression)
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            state = await page.evaluate(
                "window.rtservePage ? {state: rtservePage.state, notice: rtservePage.notice} : null"
            )
            raise AssertionError(f"timed out waiting for {what or expression}; page: {state}")
        await asyncio.sleep(0.1)


def console_errors(page: Any) -> Callable[[], list[str]]:
    """Collects uncaught page errors (a JS exception is a failed test, not a silent page)."""
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return lambda: errors
