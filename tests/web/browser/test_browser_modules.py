"""The pages' pure modules, run in Chromium as the pages run them: the Prometheus text parser
and the dashboard's rate/quantile arithmetic (checked against prometheus-client's parser on
the server's own /metrics), and the WebSocket fallback's PCM helpers (rate conversion keeps
pitch and length, the playback queue stays bounded, pcm16 base64 round-trips)."""

from __future__ import annotations

import json
import math

import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from rtserve.config import load_config
from tests.web.browser_support import chromium, needs_chromium, write_voice_wav
from tests.web.realtime_support import loopback_config, running

# One server and one browser for the module: these tests only run code in a page.
pytestmark = [needs_chromium, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def page(tmp_path_factory: pytest.TempPathFactory):
    wav = write_voice_wav(tmp_path_factory.mktemp("modules") / "v.wav")
    async with running(loopback_config(load_config(environ={}))) as base, chromium(wav) as context:
        page = await context.new_page()
        await page.goto(base + "/static/style.css")  # same origin, no page script running
        yield page


async def js(page, body: str):
    """Run ``body`` (an async function body) with the modules imported as ``prom`` and ``pcm``."""
    return await page.evaluate(f"""async () => {{
        const prom = await import('/static/prometheus-text.js');
        const pcm = await import('/static/pcm-stream.js');
        {body}
    }}""")


async def test_label_values_are_unescaped_and_odd_lines_are_skipped(page) -> None:
    parsed = await js(
        page,
        r"""
        const text = 'x_total{a="q\\"z",b="back\\\\slash",c="new\\nline"} 1.5e3\n'
                   + '# HELP x_total help\n# TYPE x counter\nbroken{a="open 1\nnan_metric NaN\n'
                   + 'inf_metric{le="+Inf"} +Inf 1700000000\n';
        const e = new prom.Exposition(text);
        return {x: e.samples.get('x_total'), broken: e.has('broken'), nan: e.total('nan_metric'),
                inf: e.samples.get('inf_metric')[0].value === Infinity, types: [...e.types]};""",
    )
    assert parsed["x"] == [
        {"name": "x_total", "labels": {"a": 'q"z', "b": "back\\slash", "c": "new\nline"}, "value": 1500}
    ]
    assert parsed["broken"] is False and parsed["inf"] is True
    assert math.isnan(parsed["nan"])  # NaN is a value Prometheus allows
    assert parsed["types"] == [["x", "counter"]]


async def test_the_servers_own_metrics_parse_as_prometheus_client_parses_them(page) -> None:
    text = await page.evaluate("fetch('/metrics').then((r) => r.text())")
    expected: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            expected[sample.name] = expected.get(sample.name, 0) + sample.value
    got = await js(
        page,
        f"""
        const e = new prom.Exposition({json.dumps(text)});
        return Object.fromEntries([...e.samples.keys()].map((k) => [k, e.total(k)]));""",
    )
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert got[name] == pytest.approx(value), name


async def test_quantile_and_rate_match_promql(page) -> None:
    got = await js(
        page,
        """
        const before = new Map([['0.1', 10], ['0.2', 20], ['0.4', 20], ['+Inf', 20]]);
        const now = new Map([['0.1', 15], ['0.2', 30], ['0.4', 40], ['+Inf', 40]]);
        return {p50: prom.quantile(0.5, now, before), p99: prom.quantile(0.99, now, before),
                p100: prom.quantile(1, now, null), idle: prom.quantile(0.5, now, now),
                rate: prom.rate(30, 10, 4), reset: prom.rate(3, 10, 1), first: prom.rate(3, undefined, 1)};""",
    )
    # Increases: 5 in (0, 0.1], 5 in (0.1, 0.2], 10 in (0.2, 0.4]; histogram_quantile interpolates.
    assert got["p50"] == pytest.approx(0.2)  # rank 10 = the top of the second bucket
    assert got["p99"] == pytest.approx(0.2 + 0.2 * (19.8 - 10) / 10)
    assert got["p100"] == pytest.approx(0.4)
    assert got["idle"] is None
    assert got["rate"] == 5 and got["reset"] == 3 and got["first"] is None


async def test_resampling_keeps_pitch_and_length_across_chunk_boundaries(page) -> None:
    got = await js(
        page,
        """
        const tone = (rate, n) => Float32Array.from({length: n}, (_, i) => Math.sin(2 * Math.PI * 1000 * i / rate));
        const crossings = (x) => x.reduce((c, v, i) => c + (i && (x[i - 1] < 0) !== (v < 0) ? 1 : 0), 0);
        const convert = (from, to, input) => {
          const r = new pcm.LinearResampler(from, to);
          const parts = [];
          for (let i = 0; i < input.length; i += 333) parts.push(...r.process(input.subarray(i, i + 333)));
          return Float32Array.from(parts);
        };
        const down = convert(48000, 24000, tone(48000, 48000));
        const up = convert(24000, 44100, tone(24000, 24000));
        // Agent audio as the cascade sends it (960-sample deltas, a short tail) into a 44.1 kHz
        // context: the rate ratio is inexact in floating point, and no sample may be lost or NaN.
        const r = new pcm.LinearResampler(24000, 44100);
        let produced = 0;
        let fed = 0;
        let finite = true;
        for (let k = 0; k < 200; k++) {
          const x = tone(24000, k % 7 === 6 ? 21 : 960);
          fed += x.length;
          const y = r.process(x);
          produced += y.length;
          finite = finite && y.every(Number.isFinite);
        }
        return {down: down.length, downCross: crossings(down), up: up.length, upCross: crossings(up),
                finite, produced, wanted: fed * 44100 / 24000};""",
    )
    assert abs(got["down"] - 24000) <= 2 and abs(got["up"] - 44100) <= 2
    assert got["finite"] is True and abs(got["produced"] - got["wanted"]) <= 2
    for key in ("downCross", "upCross"):
        assert abs(got[key] - 2000) <= 4, got  # one second of 1 kHz: 2000 sign changes


async def test_playback_queue_is_bounded_and_counts_what_it_played(page) -> None:
    got = await js(
        page,
        """
        const q = new pcm.PlaybackQueue(1000);
        for (let i = 0; i < 5; i++) q.push(new Float32Array(400).fill(0.5));
        const out = new Float32Array(300);
        q.pull(out);
        const queuedAfterPull = q.queued;
        q.clear();
        const silent = new Float32Array(128).fill(1);
        q.pull(silent);
        const round = pcm.pcm16Base64ToFloat(pcm.floatToPcm16Base64(Float32Array.from([0, 0.5, -0.5, 1, -1, 2])));
        return {dropped: q.dropped, played: q.played, queuedAfterPull, energy: q.energy,
                silent: silent.every((v) => v === 0), round: [...round]};""",
    )
    assert got["dropped"] == 1200  # 2000 pushed over a 1000 bound: the oldest three chunks went
    assert got["queuedAfterPull"] == 500 and got["played"] == 300
    assert got["energy"] == pytest.approx(300 * 0.25)
    assert got["silent"] is True  # an empty queue plays silence, and does not count it
    assert got["round"] == pytest.approx([0, 0.5, -0.5, 32767 / 32768, -1, 32767 / 32768], abs=1e-4)
