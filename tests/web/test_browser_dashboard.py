"""The operator dashboard at ``/dashboard`` in headless Chromium: while a realtime session
runs on the lockstep engine, its charts move (new scrapes, new numbers, new pixels) and
show the live session, tick times against the 80 ms budget and CPU per process."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from rtserve.config import ServerConfig
from tests.web.browser_support import HANG_GUARD_S, chromium, console_errors, needs_chromium, tiny_config, until
from tests.web.browser_support import write_voice_wav
from tests.web.realtime_support import pcm16_b64, running, ws_url

pytestmark = [needs_chromium, pytest.mark.slow]

CANVASES = "[...document.querySelectorAll('#charts canvas')].map((c) => c.toDataURL())"


async def talk(ws: aiohttp.ClientWebSocketResponse, stop: asyncio.Event) -> None:
    """A client speaking in 80 ms chunks, roughly in real time, until told to stop."""
    chunk = pcm16_b64((3000 * np.sin(np.arange(1920) / 5)).astype(np.int16))
    while not stop.is_set():
        await ws.send_json({"type": "input_audio_buffer.append", "audio": chunk})
        await asyncio.sleep(0.08)


async def test_dashboard_charts_move_with_a_live_session(config: ServerConfig, tmp_path: Path) -> None:
    wav = write_voice_wav(tmp_path / "voice.wav")
    stop = asyncio.Event()
    async with (running(tiny_config(config)) as base, chromium(wav) as context, aiohttp.ClientSession() as http,
                http.ws_connect(ws_url(base)) as ws):
        assert (await ws.receive_json(timeout=HANG_GUARD_S))["type"] == "session.created"
        speaker = asyncio.create_task(talk(ws, stop))
        try:
            page = await context.new_page()
            errors = console_errors(page)
            await page.goto(base + "/dashboard")
            first = await until(page, "rtserveDashboard.latest && rtserveDashboard.latest.tick "
                                      "&& rtserveDashboard.latest.tick.mean !== null && rtserveDashboard.latest",
                                what="a tick time")
            scrapes = await page.evaluate("rtserveDashboard.scrapes")
            pixels = await page.evaluate(CANVASES)
            await until(page, f"rtserveDashboard.scrapes >= {scrapes + 2}", what="two more scrapes")
            second = await page.evaluate("rtserveDashboard.latest")
            assert await page.evaluate(CANVASES) != pixels  # the charts were redrawn with new points
            await page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
        finally:
            stop.set()
            await speaker

    assert second["at"] > first["at"]
    assert second["tick"]["budget"] == pytest.approx(80.0)
    for latest in (first, second):
        assert 0 < latest["tick"]["mean"] < 10_000
        assert latest["sessions"]["/v1/realtime"] == 1 and latest["sessions"]["engine slots"] == 1
        assert set(latest["cpuPercent"]) == {"server"}
    assert second["cpuPercent"]["server"] > 0
    assert errors() == []
