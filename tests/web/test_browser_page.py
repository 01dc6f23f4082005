"""The voice page at ``/`` in headless Chromium with a fake microphone: it connects, shows the
agent's transcript, plays the agent's audio, sends its settings, falls back to the WebSocket
route, says when the server is full or wants a key.

Assertions read what the page shows (``window.rtservePage`` mirrors its DOM and counters):
audio "played" means samples that reached the page's audio output, with energy in them.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from rtserve.config import ServerConfig
from tests.web.browser_support import HANG_GUARD_S, chromium, console_errors, needs_chromium, tiny_config, until
from tests.web.browser_support import write_voice_wav
from tests.web.realtime_support import running, ws_url

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
    stats = await until(page, "rtservePage.stats && rtservePage.stats.playedSeconds > 0.5 "
                              "&& rtservePage.stats.energy > 0 && rtservePage.stats", what="agent audio played")
    mic_db = await until(page, "parseFloat(document.querySelector('#mic-db').textContent) > -60 "
                               "&& document.querySelector('#mic-db').textContent", what="a microphone level")
    assert float(mic_db.split()[0]) > -60
    return stats


async def test_websocket_call_shows_the_reply_plays_it_and_applies_settings(config: ServerConfig, wav: Path,
                                                                              tmp_path: Path) -> None:
    async with running(tiny_config(config)) as base, chromium(wav) as context:
        page, errors = await open_page(context, base, transport="websocket", instructions=INSTRUCTIONS)
        stats = await assert_agent_heard_and_seen(page)
        assert stats["transport"] == "websocket" and stats["bytesIn"] > 0
        # The settings panel reached the server: it echoes them in session.updated.
        await until(page, f"rtservePage.session && rtservePage.session.instructions === {INSTRUCTIONS!r}",
                    what="session.updated with the page's instructions")
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
