"""The operator dashboard at ``/dashboard`` in headless Chromium: while the voice page holds a
WebRTC call on the lockstep engine, the dashboard's charts move (new scrapes, new numbers, new
pixels) and show the live call, tick times against the 80 ms budget and CPU per process; with
workers' labelled samples it tells the processes apart and sums sessions over workers."""

from __future__ import annotations

from pathlib import Path

import pytest

from rtserve.config import ServerConfig
from tests.web.browser.test_browser_page import open_page
from tests.web.browser_support import chromium, console_errors, needs_chromium, tiny_config, until, write_voice_wav
from tests.web.realtime_support import loopback_config, running
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
        first = await until(
            page,
            "rtserveDashboard.latest && rtserveDashboard.latest.tick "
            "&& rtserveDashboard.latest.tick.mean !== null && rtserveDashboard.latest",
            what="a tick time",
        )
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
        assert latest["gpuMemoryGB"] == {}  # no process here uses CUDA: the chart says so, not zeros
    assert second["cpuPercent"]["server"] > 0
    assert second["silence"]["silence stepped"] >= 0  # ms a second, partial frames' padding included


def worker_exposition(scrape: int) -> str:
    """What /metrics says with --workers 2: the engine process unlabelled, each worker's samples
    labelled worker="i". Per scrape: the engine burns 0.1 s of CPU, worker 0 0.2 s, worker 1
    0.4 s; ten ticks, nine of them 40 ms and one 120 ms. The engine process holds GPU memory on one
    device, worker 1 on two."""
    cpu = {"": 0.1, 'worker="0"': 0.2, 'worker="1"': 0.4}
    lines = ["# TYPE process_cpu_seconds_total counter"]
    lines += [f"process_cpu_seconds_total{{{labels}}} {rate * scrape}" for labels, rate in cpu.items()]
    ticks = 10 * scrape
    lines += [
        "# TYPE rtserve_lockstep_tick_seconds histogram",
        f'rtserve_lockstep_tick_seconds_bucket{{le="0.08"}} {9 * scrape}',
        f'rtserve_lockstep_tick_seconds_bucket{{le="0.16"}} {ticks}',
        f'rtserve_lockstep_tick_seconds_bucket{{le="+Inf"}} {ticks}',
        f"rtserve_lockstep_tick_seconds_count {ticks}",
        f"rtserve_lockstep_tick_seconds_sum {0.48 * scrape}",
        "# TYPE rtserve_lockstep_frame_budget_seconds gauge",
        "rtserve_lockstep_frame_budget_seconds 0.08",
        "# TYPE rtserve_realtime_connections gauge",
        'rtserve_realtime_connections{route="/v1/realtime",worker="0"} 2',
        'rtserve_realtime_connections{route="/v1/realtime",worker="1"} 3',
        "# TYPE rtserve_webrtc_calls gauge",
        'rtserve_webrtc_calls{worker="1"} 4',
        "# TYPE rtserve_torch_cuda_memory_bytes gauge",
        'rtserve_torch_cuda_memory_bytes{device="0",kind="reserved"} 3000000000',
        'rtserve_torch_cuda_memory_bytes{device="0",kind="allocated"} 2000000000',
        'rtserve_torch_cuda_memory_bytes{worker="1",device="0",kind="reserved"} 1000000000',
        'rtserve_torch_cuda_memory_bytes{worker="1",device="1",kind="reserved"} 500000000',
    ]
    return "\n".join(lines) + "\n"


async def test_dashboard_tells_processes_apart_and_sums_workers(config: ServerConfig, tmp_path: Path) -> None:
    scrapes = 0

    async def fulfill(route) -> None:
        nonlocal scrapes
        scrapes += 1
        await route.fulfill(
            status=200, body=worker_exposition(scrapes), headers={"Content-Type": "text/plain; version=0.0.4"}
        )

    async with running(loopback_config(config)) as base, chromium(write_voice_wav(tmp_path / "voice.wav")) as context:
        await context.route("**/metrics", fulfill)  # the page reads these instead of this server's own
        page = await context.new_page()
        errors = console_errors(page)
        await page.goto(base + "/dashboard")
        latest = await until(page, "rtserveDashboard.scrapes >= 3 && rtserveDashboard.latest", what="three scrapes")
        assert errors() == []

    cpu = latest["cpuPercent"]
    assert set(cpu) == {"engine", "worker 0", "worker 1"}
    assert cpu["worker 0"] == pytest.approx(2 * cpu["engine"], rel=1e-6)
    assert cpu["worker 1"] == pytest.approx(4 * cpu["engine"], rel=1e-6)
    assert latest["sessions"]["/v1/realtime"] == 5 and latest["sessions"]["webrtc"] == 4
    tick = latest["tick"]
    assert tick["mean"] == pytest.approx(48.0) and tick["budget"] == pytest.approx(80.0)
    # p99 of 9 ticks <= 80 ms and 1 in (80, 160]: rank 9.9 is 90 % into that bucket.
    assert tick["p99"] == pytest.approx(80 + 80 * 0.9)
    assert latest["gpuMemoryGB"] == {
        "engine reserved": 3.0,
        "engine allocated": 2.0,
        "worker 1 cuda:0 reserved": 1.0,
        "worker 1 cuda:1 reserved": 0.5,
    }


def cascade_exposition(scrape: int) -> str:
    """The cascade's voice turn families after ``scrape`` scrapes: every turn's first audio came
    0.5-1 s after its end of speech, every reply decoded at 10-20 tokens/s."""
    turns, replies = scrape, 2 * scrape
    lines = [
        "# TYPE rtserve_cascade_turn_seconds histogram",
        'rtserve_cascade_turn_seconds_bucket{route="/v1/realtime",stage="first_audio",le="0.5"} 0',
        f'rtserve_cascade_turn_seconds_bucket{{route="/v1/realtime",stage="first_audio",le="1.0"}} {turns}',
        f'rtserve_cascade_turn_seconds_bucket{{route="/v1/realtime",stage="first_audio",le="+Inf"}} {turns}',
        f'rtserve_cascade_turn_seconds_count{{route="/v1/realtime",stage="first_audio"}} {turns}',
        f'rtserve_cascade_turn_seconds_sum{{route="/v1/realtime",stage="first_audio"}} {0.75 * turns}',
        "# TYPE rtserve_cascade_llm_tokens_per_second histogram",
        'rtserve_cascade_llm_tokens_per_second_bucket{route="/api/chat",le="10.0"} 0',
        f'rtserve_cascade_llm_tokens_per_second_bucket{{route="/api/chat",le="20.0"}} {replies}',
        f'rtserve_cascade_llm_tokens_per_second_bucket{{route="/api/chat",le="+Inf"}} {replies}',
        f'rtserve_cascade_llm_tokens_per_second_count{{route="/api/chat"}} {replies}',
        f'rtserve_cascade_llm_tokens_per_second_sum{{route="/api/chat"}} {15 * replies}',
    ]
    return "\n".join(lines) + "\n"


async def test_dashboard_charts_the_voice_turn_stages_per_route(config: ServerConfig, tmp_path: Path) -> None:
    scrapes = 0

    async def fulfill(route) -> None:
        nonlocal scrapes
        scrapes += 1
        await route.fulfill(
            status=200, body=cascade_exposition(scrapes), headers={"Content-Type": "text/plain; version=0.0.4"}
        )

    async with running(loopback_config(config)) as base, chromium(write_voice_wav(tmp_path / "voice.wav")) as context:
        await context.route("**/metrics", fulfill)
        page = await context.new_page()
        errors = console_errors(page)
        await page.goto(base + "/dashboard")
        latest = await until(page, "rtserveDashboard.scrapes >= 3 && rtserveDashboard.latest", what="three scrapes")
        readout = await page.text_content("#charts .chart:nth-last-child(2) output")
        assert errors() == []

    turns = latest["voiceTurns"]
    # p50 of observations all in (0.5, 1] s: half way through that bucket, as histogram_quantile says.
    assert turns["stages"] == {"first_audio /v1/realtime": pytest.approx(750.0)}
    assert turns["llmTokensPerS"] == {"/api/chat": pytest.approx(15.0)}
    assert readout.startswith("750 ms")  # the turn stages chart
