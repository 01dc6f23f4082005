"""The operator dashboard at ``/dashboard`` in headless Chromium: while the voice page holds a
WebRTC call on the lockstep engine, the dashboard's charts move (new scrapes, new numbers, new
pixels) and show the live call, tick times against the 80 ms budget and CPU per process."""

from __future__ import annotations

from pathlib import Path

import pytest

from rtserve.config import ServerConfig
from tests.web.browser_support import chromium, console_errors, needs_chromium, tiny_config, until, write_voice_wav
from tests.web.realtime_support import running
from tests.web.test_browser_page import open_page
from tests.web.webrtc_support import webrtc_config

pytestmark = [needs_chromium, pytest.mark.slow]

CANVASES = "[...document.querySelectorAll('#charts canvas')].map((c) => c.toDataURL())"


async def test_dashboard_charts_move_with_a_live_call(config: ServerConfig, tmp_path: Path) -> None:
    wav = write_voice_wav(tmp_path / "voice.wav")
    async with running(webrtc_config(tiny_config(config))) as base, chromium(wav) as context:
        call, call_errors = await open_page(context, base, transport="webrtc")
        await until(call, "rtservePage.state === 'connected'", what="the call")

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
        readout = await page.text_content("#charts .chart:first-child output")
        assert "mean tick" in readout and "ms" in readout
        await page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
        assert errors() == [] and call_errors() == []

    assert second["at"] > first["at"]
    assert second["tick"]["budget"] == pytest.approx(80.0)
    for latest in (first, second):
        assert 0 < latest["tick"]["mean"] < 10_000
        assert latest["sessions"]["webrtc"] == 1 and latest["sessions"]["engine slots"] == 1
        assert latest["sessions"].get("/v1/realtime", 0) == 0
        assert set(latest["cpuPercent"]) == {"server"}
    assert second["cpuPercent"]["server"] > 0
