"""Host work per tick of the engine process (issue 35): N lockstep sessions served across the
engine link, with a model step that costs (almost) nothing, so what is left is what the engine
process itself does per tick: link messages in and out (pickling), pushing each session's audio,
the scheduler's gather / scatter / hand-off and the frame model's host side.

The benchmark starts the engine process itself (``EngineServer`` over a ``LockstepSessionEngine``,
as ``rtserve serve --workers W`` runs it) and W worker processes that speak the real link
(``EngineLink`` + ``RemoteEngines``, as front-end workers do), each opening N/W sessions that push
80 ms of audio every 80 ms at spread phases and read every frame back. No HTTP, WebSocket or Opus:
on a 2-core machine those would starve the engine process, and none of it runs there.

Models (``--model``):

* ``loopback``: the loopback engine's ``LoopbackModel`` (a per-slot delay line);
* ``moshi-host``: ``MoshiFrameModel`` with paged int8 KV at the served context (3000 frames), a
  tiny LM and Mimi, whose frame computation is replaced by fixed outputs: the host side
  of the served Moshi step (block tables, output conversion) without the GPU step.

Reported per tree and N over the measured window: ticks, tick and step p50 / p99 (exact, from
``on_tick``), host per tick (tick minus step, mean / p99), the engine thread's and the whole
engine process's CPU per tick (ms of CPU per tick: loop thread + engine thread), underruns, and
the busiest worker process (near 100 % it, not the engine, is the limit).

``--trees`` compares code side by side in one run: each tree (a checkout, e.g. ``git worktree add
/tmp/before HEAD~3``) serves with its own ``rtserve`` (children run with ``PYTHONPATH=TREE``);
runs alternate tree by tree at each N. ``--profile`` records the engine process with py-spy
(``pip install py-spy``) over the window and prints where its samples land. ``--micro`` instead
measures, per tree, the CPU time (``time.process_time``: little moved by a loaded machine) of
the frame model's host step at batch N, of encoding one tick's events for ``--workers`` links and
of one scheduler tick (gather + scatter) around a step that costs nothing.

    .venv/bin/python benchmarks/bench_engine_host.py --sessions 64 256 512 --workers 4
    .venv/bin/python benchmarks/bench_engine_host.py --trees /tmp/before . --model moshi-host --profile
    .venv/bin/python benchmarks/bench_engine_host.py --micro --trees /tmp/before . --workers 8

On a shared 2-core machine the absolute times move with the load: compare rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyspy

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bench_engine_host.json"
FRAME = 1920
PERIOD_S = 0.08
CONTEXT = 3000  # the served Moshi context (frames)


# ---------------------------------------------------------------------------------------- children


def _moshi_host_model(batch: int) -> Any:
    import torch

    from rtserve.engines.moshi.frame_model import MoshiFrameModel
    from rtserve.engines.moshi.frame_step import FrameTensors
    from rtserve.engines.moshi.lm import MoshiLM
    from rtserve.engines.moshi.lm_config import LMConfig, MimiConfig
    from rtserve.engines.moshi.loader import LoadedModel
    from rtserve.engines.moshi.mimi import Mimi
    from rtserve.engines.moshi.paged_kv import PagedKVSpec

    torch.set_num_threads(1)
    lm_config = LMConfig.from_dict(
        {"dim": 32, "num_heads": 4, "num_layers": 1, "depformer_dim": 16, "depformer_num_heads": 2}
        | {"depformer_num_layers": 1, "depformer_dim_feedforward": 64, "context": CONTEXT}
    )
    mimi_config = MimiConfig.from_dict(  # tiny too: its state is reset row by row at every open
        {
            "seanet": {"dimension": 16, "n_filters": 4, "n_residual_layers": 1},
            "quantizer": {"dimension": 8, "n_q": 16, "bins": 32, "input_dimension": 16, "output_dimension": 16},
            "transformer": {"d_model": 16, "num_heads": 2, "num_layers": 1, "dim_feedforward": 32}
            | {"input_dimension": 16, "output_dimensions": [16], "context": 20},
        }
    )
    loaded = LoadedModel(
        MoshiLM(lm_config).eval(),
        Mimi(mimi_config, lm_config.mimi_codebooks).eval(),
        None,
        lm_config,
        mimi_config,
        None,
    )
    spec = PagedKVSpec(num_blocks=batch * CONTEXT // 64 + batch, block_size=64)
    model = MoshiFrameModel(loaded, batch, graph=False, paged_kv=spec)
    frame = model.frame
    fixed = FrameTensors(
        torch.zeros(batch, 1 + lm_config.dep_q, dtype=torch.long),
        torch.ones(batch, dtype=torch.bool),
        torch.zeros(batch, mimi_config.frame_size),
    )

    def step(key: tuple[int, bool]) -> FrameTensors:  # what a graph replay hands back, at no cost
        frame.overrides.clear()
        return fixed

    frame._step = step  # type: ignore[method-assign]
    return model


def run_engine(args: argparse.Namespace) -> None:
    """The engine process: serve ``args.batch`` slots on ``args.socket`` until killed; write the
    ticks of the measured window and this process's CPU (whole and engine thread) to ``args.out``."""
    from prometheus_client import CollectorRegistry

    from rtserve.config import ServerConfig
    from rtserve.engines.engine_set import EngineSet
    from rtserve.engines.lockstep.session import LockstepSessionEngine
    from rtserve.engines.reference import LoopbackModel
    from rtserve.engines.remote.server import EngineServer
    from rtserve.heap import freeze_long_lived

    config = ServerConfig.model_validate({"lockstep": {"batch_size": args.batch}, "robot": {"policy": "none"}})
    model = LoopbackModel(args.batch, 1) if args.model == "loopback" else _moshi_host_model(args.batch)
    window = [math.inf, math.inf]  # set once the parent says when the measured window starts
    ticks: list[tuple[float, float, float, int]] = []

    def on_tick(report: Any) -> None:
        if window[0] <= report.started <= window[1]:
            ticks.append((report.started, report.step_s, report.duration_s, report.live))

    async def serve() -> None:
        registry = CollectorRegistry()
        runtime = LockstepSessionEngine("bench", model, config, registry, supports_text_output=True, on_tick=on_tick)
        engines = EngineSet(config, registry, session_engine=runtime)
        server = EngineServer(engines)
        await server.serve_unix(args.socket)
        engines.start()
        while not runtime.ready:  # noqa: ASYNC110 - the engine thread starts in the background
            await asyncio.sleep(0.01)
        freeze_long_lived()
        thread = runtime.scheduler._thread
        assert thread is not None and thread.native_id is not None
        start = float(await asyncio.to_thread(sys.stdin.readline))
        window[:] = [start, start + args.window]
        await asyncio.sleep(max(0.0, window[0] - time.monotonic()))
        underruns = runtime.scheduler.metrics.underruns
        before = _cpu(), _cpu(thread.native_id), underruns._value.get()
        await asyncio.sleep(max(0.0, window[1] - time.monotonic()))
        after = _cpu(), _cpu(thread.native_id), underruns._value.get()
        await asyncio.to_thread(
            Path(args.out).write_text,
            json.dumps(
                {
                    "ticks": ticks,
                    "cpu_s": after[0] - before[0],
                    "engine_thread_cpu_s": after[1] - before[1],
                    "underruns": after[2] - before[2],
                }
            ),
        )
        await asyncio.sleep(3600)  # until the parent stops it

    asyncio.run(serve())


def _cpu(tid: int | None = None) -> float:
    path = "/proc/self/stat" if tid is None else f"/proc/self/task/{tid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_worker(args: argparse.Namespace) -> None:
    """One front-end worker: ``args.sessions`` sessions over the real link, each pushing a frame every
    80 ms from ``args.start_at`` at its own phase and reading every event back."""
    from rtserve.engines.remote.client import RemoteEngines
    from rtserve.engines.remote.link import EngineLink
    from rtserve.engines.values import SessionOptions

    async def work() -> None:
        link = EngineLink(lambda: asyncio.open_unix_connection(args.socket), args.index)
        link.start()
        await link.connected.wait()
        while link.offer is None or not link.offer.ready:  # noqa: ASYNC110 - offers arrive as they come
            await asyncio.sleep(0.05)
        engines = RemoteEngines(link, link.offer, max_queued_events=64)
        sessions = await asyncio.gather(
            *(engines.session_engine.open_session(f"w{args.index}s{k}", SessionOptions()) for k in range(args.sessions))
        )
        print("opened", flush=True)  # the parent starts everyone's clock once every worker is here
        args.start_at = float(await asyncio.to_thread(sys.stdin.readline))
        pcm = (0.1 * np.random.default_rng(args.index).standard_normal(FRAME)).astype(np.float32)
        end = args.start_at + args.run_s
        received = [0]

        async def speak(k: int, session: Any) -> None:
            phase = PERIOD_S * (args.index + args.workers * k) / (args.workers * args.sessions)
            due = args.start_at + phase
            while due < end:
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                session.push_audio(pcm)
                due += PERIOD_S

        async def listen(session: Any) -> None:
            async for _ in session.events():
                received[0] += 1

        listeners = [asyncio.create_task(listen(s)) for s in sessions]
        await asyncio.gather(*(speak(k, s) for k, s in enumerate(sessions)))
        print(json.dumps({"received": received[0], "cpu_s": _cpu()}), flush=True)
        for task in listeners:
            task.cancel()
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
        await engines.stop()

    asyncio.run(work())


def run_micro(args: argparse.Namespace) -> None:
    """CPU time (``time.process_time``, so a machine's other load adds little) of the per-tick host
    pieces this tree runs, at batch ``args.batch``: the Moshi frame model's step around a free model
    step, and encoding one tick's events for ``args.workers`` workers as this tree's link does."""
    import pickle

    from rtserve.engines.events import OutputAudio
    from rtserve.engines.remote import wire
    from rtserve.engines.values import SlotPrompt

    def cpu_us(work: Any, reps: int) -> float:
        rounds = []
        for _ in range(5):
            started = time.process_time()
            for _ in range(reps):
                work()
            rounds.append((time.process_time() - started) / reps * 1e6)
        return min(rounds)

    model = _moshi_host_model(args.batch)
    for slot in range(args.batch):
        model.open_slot(slot, SlotPrompt())
    frames = np.zeros((args.batch, FRAME), np.float32)
    live = np.ones(args.batch, bool)
    step_us = cpu_us(lambda: model.step(frames, live), 50)
    pcm = np.zeros(FRAME, np.float32)
    per_worker = args.batch // args.workers
    events = [(h, OutputAudio(pcm=pcm.copy(), epoch=0, tick_due=1.0, input_samples=FRAME)) for h in range(per_worker)]
    pack = getattr(wire, "pack_events", None)

    def encode() -> None:
        for _ in range(args.workers):
            body = pack(events) if pack is not None else (events,)
            wire.encode((wire.Kind.EVENTS_OUT, *body, 1.0))

    encode_us = cpu_us(encode, 200)
    frames_in = pickle.dumps((wire.Kind.FRAMES_IN, [(h, pcm) for h in range(per_worker)]), protocol=4)
    decode_us = cpu_us(lambda: [pickle.loads(frames_in) for _ in range(args.workers)], 200)
    tick_us = _scheduler_tick_us(args.batch, pcm)
    print(
        json.dumps(
            {
                "frame_model_step_us": step_us,
                "events_encode_us": encode_us,
                "frames_decode_us": decode_us,
                "scheduler_tick_us": tick_us,
            }
        )
    )


def _scheduler_tick_us(batch: int, pcm: Any) -> float:
    """CPU time of one lockstep tick around a model step that costs nothing (its outputs are made
    once): control ops, the gather of every slot's frame, the scatter of every row's output. Each
    slot gets a frame pushed before the tick and its output read after (neither timed)."""
    from prometheus_client import CollectorRegistry

    from rtserve.config import LockstepConfig
    from rtserve.engines.lockstep.scheduler import LockstepScheduler
    from rtserve.engines.values import FrameOutput

    class FixedOutputs:  # the step's host cost is measured apart (frame_model_step_us)
        batch_size, frame_size, sample_rate, output_delay_frames = batch, FRAME, 24000, 0

        def __init__(self) -> None:
            self.outputs = [FrameOutput(pcm.copy()) for _ in range(batch)]

        def open_slot(self, slot: int, prompt: Any) -> int:
            return 0

        def prefill_step(self, slot: int) -> bool:
            return True

        def step(self, frames: Any, live: Any) -> list[Any]:
            return self.outputs

        def release(self, slot: int) -> None:
            pass

    scheduler = LockstepScheduler(FixedOutputs(), LockstepConfig(batch_size=batch), CollectorRegistry())
    leases = [scheduler.acquire() for _ in range(batch)]
    scheduler.tick()  # opens every slot
    rounds = []
    for _ in range(5):
        spent = 0.0
        for _ in range(100):
            for lease in leases:
                lease.push_samples(pcm)
                lease.output.pop()
            started = time.process_time()
            scheduler.tick()
            spent += time.process_time() - started
        rounds.append(spent / 100 * 1e6)
    return min(rounds)


# ---------------------------------------------------------------------------------------- parent


def _child(tree: Path, *argv: str) -> subprocess.Popen[str]:
    # The tree first (its rtserve is the one measured), then whatever the caller's path held (a
    # host may keep its wheels in a side folder on PYTHONPATH).
    path = os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), *argv],
        cwd=tree,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def run_point(args: argparse.Namespace, tree: Path, sessions: int, folder: Path) -> dict[str, Any]:
    socket_path = str(folder / "engine.sock")
    out = folder / "engine.json"
    out.unlink(missing_ok=True)
    common = ["--socket", socket_path, "--model", args.model]
    engine = _child(
        tree, "--role", "engine", *common, "--batch", str(sessions), "--out", str(out), "--window", str(args.duration)
    )
    per_worker = [len(part) for part in np.array_split(np.arange(sessions), args.workers)]
    run_s = str(args.warmup + args.duration + 0.5)
    worker_argv = ["--role", "worker", *common, "--workers", str(args.workers)]
    workers = [
        _child(tree, *worker_argv, "--index", str(i), "--sessions", str(count), "--run-s", run_s)
        for i, count in enumerate(per_worker)
    ]
    profile: dict[str, Any] | None = None
    try:
        for worker in workers:  # every session open (a loaded machine may take a while) before the clock starts
            assert worker.stdout is not None and worker.stdout.readline().strip() == "opened", "a worker failed"
        started = time.monotonic()
        start_at = started + 1.0
        window_start = start_at + args.warmup
        for proc, at in [(engine, window_start), *((w, start_at) for w in workers)]:
            assert proc.stdin is not None
            proc.stdin.write(f"{at!r}\n")
            proc.stdin.flush()
        if args.profile:
            time.sleep(max(0.0, window_start - time.monotonic()))
            profile = pyspy.record(engine.pid, args.duration, folder / "profile.txt")
        outputs = [
            json.loads((w.communicate(timeout=args.warmup + args.duration + 60)[0]).splitlines()[-1]) for w in workers
        ]
        deadline = time.monotonic() + 30
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        result = json.loads(out.read_text())
    finally:
        for proc in [engine, *workers]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    ticks = result["ticks"]
    step = [t[1] * 1e3 for t in ticks]
    tick = [t[2] * 1e3 for t in ticks]
    host = [a - b for a, b in zip(tick, step)]
    n = max(1, len(ticks))
    return {
        "tree": str(tree),
        "sessions": sessions,
        "ticks": len(ticks),
        "live_min": min((t[3] for t in ticks), default=0),
        "tick_p50_ms": _pct(tick, 50),
        "tick_p99_ms": _pct(tick, 99),
        "step_p50_ms": _pct(step, 50),
        "step_p99_ms": _pct(step, 99),
        "host_mean_ms": float(np.mean(host)) if host else float("nan"),
        "host_p99_ms": _pct(host, 99),
        "engine_thread_cpu_ms_per_tick": 1e3 * result["engine_thread_cpu_s"] / n,
        "engine_process_cpu_ms_per_tick": 1e3 * result["cpu_s"] / n,
        "engine_process_cpu_pct": 100 * result["cpu_s"] / args.duration,
        "underruns": result["underruns"],
        "received": sum(o["received"] for o in outputs),
        "busiest_worker_cpu_pct": max(100 * o["cpu_s"] / (time.monotonic() - started) for o in outputs),
        "profile": profile,
    }


def print_table(points: list[dict[str, Any]]) -> None:
    columns: list[tuple[str, int, Callable[[dict[str, Any]], str]]] = [
        ("tree", 24, lambda p: Path(p["tree"]).name or p["tree"]),
        ("N", 4, lambda p: str(p["sessions"])),
        ("ticks", 5, lambda p: str(p["ticks"])),
        ("tick p50/p99", 13, lambda p: f"{p['tick_p50_ms']:.1f}/{p['tick_p99_ms']:.1f}"),
        ("step p50/p99", 13, lambda p: f"{p['step_p50_ms']:.1f}/{p['step_p99_ms']:.1f}"),
        ("host mean/p99", 13, lambda p: f"{p['host_mean_ms']:.1f}/{p['host_p99_ms']:.1f}"),
        ("eng thr cpu/tick", 16, lambda p: f"{p['engine_thread_cpu_ms_per_tick']:.1f}ms"),
        ("process cpu/tick", 16, lambda p: f"{p['engine_process_cpu_ms_per_tick']:.1f}ms"),
        ("proc cpu", 8, lambda p: f"{p['engine_process_cpu_pct']:.0f}%"),
        ("underruns", 9, lambda p: str(int(p["underruns"]))),
        ("worker max", 10, lambda p: f"{p['busiest_worker_cpu_pct']:.0f}%"),
    ]
    print(" ".join(f"{name:>{width}}" for name, width, _ in columns))
    for p in points:
        print(" ".join(f"{cell(p):>{width}}" for _, width, cell in columns))
    print(
        "tick/step: the lockstep tick and its model step (ms, exact, measured window); host: tick - step; "
        "cpu/tick: CPU ms per tick of the engine thread and of the whole engine process (loop thread: link, "
        "pushes, event forwarding); worker max: the busiest worker process (% of a core)"
    )
    for p in points:
        if p.get("profile"):
            pyspy.print_profile(f"{Path(p['tree']).name} N={p['sessions']}", p["profile"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--role", choices=["parent", "engine", "worker", "micro"], default="parent", help=argparse.SUPPRESS
    )
    parser.add_argument("--sessions", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("--workers", type=int, default=4, help="worker processes (front ends) on the link")
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds per point")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--model", choices=["loopback", "moshi-host"], default="loopback")
    parser.add_argument("--trees", type=Path, nargs="+", default=[ROOT], help="checkouts to compare, in one run")
    parser.add_argument("--profile", action="store_true", help="py-spy the engine process over each window")
    parser.add_argument(
        "--micro",
        action="store_true",
        help="instead: CPU time of the frame model's host step and of one tick's link encoding, per tree",
    )
    parser.add_argument("--json", type=Path, default=RESULTS)
    # children
    for name in ("--socket", "--out"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    for name in ("--start-at", "--window", "--run-s"):
        parser.add_argument(name, type=float, help=argparse.SUPPRESS)
    for name in ("--batch", "--index"):
        parser.add_argument(name, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "engine":
        run_engine(args)
        return
    if args.role == "micro":
        run_micro(args)
        return
    if args.role == "worker":
        args.sessions = args.sessions[0]
        run_worker(args)
        return
    if args.micro:
        micro = []
        for sessions in args.sessions:
            for tree in args.trees:
                child = _child(
                    tree.resolve(), "--role", "micro", "--batch", str(sessions), "--workers", str(args.workers)
                )
                out, _ = child.communicate(timeout=600)
                micro.append({"tree": str(tree), "sessions": sessions, **json.loads(out.splitlines()[-1])})
        print(
            f"{'tree':>24} {'N':>4} {'frame model step':>16} {'events encode':>13} {'frames decode':>13} "
            f"{'scheduler tick':>14}  (CPU us/tick)"
        )
        for m in micro:
            print(
                f"{Path(m['tree']).resolve().name:>24} {m['sessions']:>4} {m['frame_model_step_us']:>16.0f} "
                f"{m['events_encode_us']:>13.0f} {m['frames_decode_us']:>13.0f} {m['scheduler_tick_us']:>14.0f}"
            )
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"benchmark": "bench_engine_host --micro", "points": micro}, indent=2) + "\n")
        return
    points = []
    with tempfile.TemporaryDirectory(prefix="bench_engine_host_") as tmp:
        for sessions in args.sessions:
            for tree in args.trees:
                points.append(run_point(args, tree.resolve(), sessions, Path(tmp)))
                print(f"{tree} N={sessions}: done", file=sys.stderr)
    print_table(points)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "benchmark": "bench_engine_host",
                "model": args.model,
                "workers": args.workers,
                "duration_s": args.duration,
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()},
                "points": points,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
