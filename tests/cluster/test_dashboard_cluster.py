"""The operator dashboard of a front-end over two engines (TCP link, engine-labelled metrics),
in headless Chromium: it reads the series this front-end's ``/metrics`` exports and shows each
engine's slots used and free and its tick time."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from rtserve.config import ServerConfig
from tests.cluster.clients import eventually, open_session
from tests.cluster.test_admission import SLOTS, front_end
from tests.web.browser_support import chromium, console_errors, needs_chromium, until, write_voice_wav

pytestmark = [needs_chromium, pytest.mark.slow]

READY = (
    "rtserveDashboard.scrapes >= 2 && rtserveDashboard.latest && "
    "Object.values(rtserveDashboard.latest.engines).length === 2 && "
    "Object.values(rtserveDashboard.latest.engines).every((e) => e.meanTickMs !== null) && "
    "rtserveDashboard.latest"
)


async def test_the_dashboard_shows_slots_and_tick_time_per_engine(config: ServerConfig, tmp_path: Path) -> None:
    async with (
        front_end(config) as (base, cluster, _),
        aiohttp.ClientSession() as http,
        chromium(write_voice_wav(tmp_path / "voice.wav")) as context,
    ):
        clients = [await open_session(http, base) for _ in range(3)]
        await eventually(
            lambda: [s["sessions"] for s in cluster.placement().values()] == [2, 1],
            what="three sessions over two engines",
        )
        page = await context.new_page()
        errors = console_errors(page)
        await page.goto(base + "/dashboard")
        latest = await until(page, READY, what="both engines charted")
        titles = await page.evaluate("[...document.querySelectorAll('#charts h2')].map((h) => h.textContent)")
        assert errors() == []
        for client in clients:
            await client.close()

    engines = latest["engines"]
    assert {name: (e["slots"], e["used"], e["free"]) for name, e in engines.items()} == {
        "engine-0": (SLOTS, 2, 0),
        "engine-1": (SLOTS, 1, 1),
    }
    assert all(0 < e["meanTickMs"] < 80 for e in engines.values())
    assert any("per engine" in title for title in titles), titles
