"""The voice page at ``/`` in headless Chromium with a fake microphone: it connects, shows the
agent's transcript, plays the agent's audio, sends its settings, falls back to the WebSocket
route, says when the server is full or wants a key.

Assertions read what the page shows (``window.rtservePage`` mirrors its DOM and counters):
audio "played" means samples that reached the page's audio output, with energy in them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from rtserve.config import ServerConfig
from tests.web.browser_support import (
    HANG_GUARD_S,
    chromium,
    console_errors,
    needs_chromium,
    tiny_config,
    until,
    write_voice_wav,
)
from tests.web.realtime_support import running, ws_url
from tests.web.webrtc_support import webrtc_config

pytestmark = [needs_chromium, pytest.mark.slow]

INSTRUCTIONS = "Answer in one short sentence."


@pytest.fixture
def wav(tmp_path: Path) -> Path:
    return write_voice_wav(tmp_path / "voice.wav")


async def open_page(context, base: str, *, transport: str, key: str = "", instructions: str = ""):
    page = await context.new_page()
    errors = console_errors(page)
    await page.goto(base + "/")
    await page.select_option("select[name=transport]", transport)
    # Raw microphone, as the design asks of browser tests (no echo cancellation to adapt).
    await page.uncheck("input[name=echo_cancellation]")
    if key:
        await page.fill("#api-key", key)
    if instructions:
        await page.fill("textarea[name=instructions]", instructions)
    await page.click("#connect")
    return page, errors


async def assert_agent_heard_and_seen(page) -> dict:
    """The agent's transcript is on the page and its audio played; returns the page's stats."""
    await until(page, "rtservePage.state === 'connected'", what="connected")
    text = await until(page, "rtservePage.agentText()", what="an agent transcript on the page")
    assert text.strip()
    assert text in await page.text_content("#transcript")  # what the page shows, not only what it holds
    stats = await until(
        page,
        "rtservePage.stats && rtservePage.stats.playedSeconds > 0.5 "
        "&& rtservePage.stats.energy > 0 && rtservePage.stats",
        what="agent audio played",
    )
    mic_db = await until(
        page,
        "parseFloat(document.querySelector('#mic-db').textContent) > -60 "
        "&& document.querySelector('#mic-db').textContent",
        what="a microphone level",
    )
    assert float(mic_db.split()[0]) > -60
    return stats


async def test_webrtc_call_shows_the_reply_plays_it_and_measures_the_path(
    config: ServerConfig, wav: Path, tmp_path: Path
) -> None:
    async with running(webrtc_config(tiny_config(config))) as base, chromium(wav) as context:
        page, errors = await open_page(context, base, transport="webrtc", instructions=INSTRUCTIONS)
        stats = await assert_agent_heard_and_seen(page)
        # getStats: the inbound Opus stream and the selected ICE pair's round trip.
        assert stats["transport"] == "webrtc" and stats["connection"] == "connected"
        assert stats["bytesIn"] > 1000
        stats = await until(
            page,
            "rtservePage.stats.rttMs !== null && rtservePage.stats.jitterMs !== null && rtservePage.stats",
            what="round trip and jitter",
        )
        assert 0 <= stats["rttMs"] < 1000 and 0 <= stats["jitterMs"] < 1000
        assert (await page.text_content("#stat-rtt")).endswith(" ms")
        await until(
            page,
            f"rtservePage.session && rtservePage.session.instructions === {INSTRUCTIONS!r}",
            what="session.updated with the page's instructions",
        )
        assert await page.evaluate("rtservePage.fallbackReason") is None
        await page.screenshot(path=str(tmp_path / "page-webrtc.png"), full_page=True)
        assert (tmp_path / "page-webrtc.png").stat().st_size > 10_000

        await page.click("#hangup")
        await until(page, "rtservePage.state === 'idle'", what="hung up")
        async with aiohttp.ClientSession() as http:  # the server ended the call too
            for _ in range(int(HANG_GUARD_S * 10)):
                async with http.get(base + "/metrics") as resp:
                    if "rtserve_webrtc_calls 0.0" in await resp.text():
                        break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the call is still live on the server after hang-up")
        assert errors() == []


async def test_websocket_call_shows_the_reply_plays_it_and_applies_settings(
    config: ServerConfig, wav: Path, tmp_path: Path
) -> None:
    async with running(tiny_config(config)) as base, chromium(wav) as context:
        page, errors = await open_page(context, base, transport="websocket", instructions=INSTRUCTIONS)
        stats = await assert_agent_heard_and_seen(page)
        assert stats["transport"] == "websocket" and stats["bytesIn"] > 0
        # The settings panel reached the server: it echoes them in session.updated.
        await until(
            page,
            f"rtservePage.session && rtservePage.session.instructions === {INSTRUCTIONS!r}",
            what="session.updated with the page's instructions",
        )
        assert await page.text_content("#stat-transport") == "websocket"
        await page.screenshot(path=str(tmp_path / "page-websocket.png"), full_page=True)
        assert (tmp_path / "page-websocket.png").stat().st_size > 10_000

        await page.click("#hangup")
        await until(page, "rtservePage.state === 'idle'", what="hung up")
        assert await page.text_content("#state") == "hung up"
        assert errors() == []


async def test_auto_falls_back_to_websocket_when_webrtc_cannot_connect(config: ServerConfig, wav: Path) -> None:
    async with running(tiny_config(config)) as base, chromium(wav) as context:
        # As a server (or proxy) without the WebRTC route answers.
        await context.route("**/v1/realtime/calls", lambda route: route.fulfill(status=404, body="Not Found"))
        page, errors = await open_page(context, base, transport="auto")
        await assert_agent_heard_and_seen(page)
        assert await page.evaluate("rtservePage.transport") == "websocket"
        notice = await page.text_content("#notice")
        assert "WebRTC could not connect" in notice and "WebSocket" in notice
        assert await page.text_content("#stat-transport") == "websocket (fallback)"
        assert errors() == []


async def test_a_full_server_says_so(config: ServerConfig, wav: Path) -> None:
    config.sessions.max_sessions = 1
    async with running(tiny_config(config)) as base, chromium(wav) as context:
        async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(base)) as holder:
            first = await holder.receive_json(timeout=HANG_GUARD_S)
            assert first["type"] == "session.created"  # the one session the server has room for
            page, errors = await open_page(context, base, transport="websocket")
            await until(page, "rtservePage.state === 'full'", what="the server-full state")
            assert await page.is_visible("#notice")
            notice = await page.text_content("#notice")
            assert notice.startswith("The server is full")
            assert await page.get_attribute("#notice", "data-kind") == "full"
            assert await page.is_enabled("#connect")  # the user may try again
            assert errors() == []


async def test_a_full_server_refuses_a_webrtc_call_with_a_message(config: ServerConfig, wav: Path) -> None:
    config.sessions.max_sessions = 1
    async with running(webrtc_config(tiny_config(config))) as base, chromium(wav) as context:
        async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(base)) as holder:
            assert (await holder.receive_json(timeout=HANG_GUARD_S))["type"] == "session.created"
            page, errors = await open_page(context, base, transport="auto")
            await until(page, "rtservePage.state === 'full'", what="the server-full state")
            assert (await page.text_content("#notice")).startswith("The server is full")
            assert await page.evaluate("rtservePage.fallbackReason") is None  # full is not a reason to fall back
            assert errors() == []


async def test_the_page_places_its_call_with_a_minted_ek_key_not_the_server_key(
    config: ServerConfig, wav: Path
) -> None:
    config.api_key = "sk-page-test"
    async with running(webrtc_config(tiny_config(config))) as base, chromium(wav) as context:
        calls: list[str] = []
        context.on(
            "request",
            lambda r: (
                calls.append(r.headers.get("authorization", "")) if r.url.endswith("/v1/realtime/calls") else None
            ),
        )
        page, errors = await open_page(context, base, transport="webrtc", key=config.api_key)
        await assert_agent_heard_and_seen(page)
        assert len(calls) == 1 and calls[0].startswith("Bearer ek_") and config.api_key not in calls[0]
        assert errors() == []


async def test_a_server_with_an_api_key_needs_it_in_the_key_field(config: ServerConfig, wav: Path) -> None:
    config.api_key = "sk-page-test"
    async with running(tiny_config(config)) as base, chromium(wav) as context:
        page, errors = await open_page(context, base, transport="websocket")
        await until(page, "rtservePage.state === 'failed'", what="the refusal")
        assert "API key" in await page.text_content("#notice")

        await page.fill("#api-key", config.api_key)
        await page.click("#connect")
        await assert_agent_heard_and_seen(page)
        assert errors() == []


async def test_settings_the_engine_refuses_are_shown_and_settings_are_remembered(
    config: ServerConfig, wav: Path
) -> None:
    async with running(webrtc_config(tiny_config(config))) as base, chromium(wav) as context:
        page = await context.new_page()
        errors = console_errors(page)
        await page.goto(base + "/")
        await page.fill("textarea[name=instructions]", INSTRUCTIONS)
        await page.select_option("select[name=turn_detection]", "server_vad")  # the tiny engine has no VAD
        assert await page.is_hidden("#send-turn")
        await page.reload()  # remembered in this browser
        assert await page.input_value("textarea[name=instructions]") == INSTRUCTIONS
        assert await page.input_value("select[name=turn_detection]") == "server_vad"

        await page.select_option("select[name=transport]", "webrtc")
        await page.uncheck("input[name=echo_cancellation]")
        await page.click("#connect")
        await until(page, "rtservePage.notice && rtservePage.notice.kind === 'error'", what="the refusal")
        assert "server VAD" in await page.text_content("#notice")
        assert await page.evaluate("rtservePage.state") == "connected"  # a refused setting keeps the call

        await page.select_option("select[name=turn_detection]", "none")
        assert await page.is_visible("#send-turn") and await page.is_enabled("#send-turn")
        await page.click("#apply")
        await until(
            page,
            "rtservePage.session && rtservePage.session.audio.input.turn_detection === null "
            f"&& rtservePage.session.instructions === {INSTRUCTIONS!r}",
            what="the applied settings",
        )
        assert errors() == []
