"""``rtserve serve --workers 2``: one engine process, two front-end workers on one port.

Faults stay where they happen: killing a worker ends only its own sessions (a session on
the other worker keeps streaming) and the worker comes back; killing the engine process
ends every session with ``engine_failure``, ``/health`` is 503 until the engine is back;
no child outlives the supervisor, even when it is SIGKILLed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest

from tests.cluster.clients import DuplexClient, drop_and_resume, echoes_again, echoes_over, open_session
from tests.test_cli import CLEAN_ENV, CLI, _free_port, _health
from tests.web.realtime_support import echoed_tags

pytestmark = pytest.mark.slow
START_TIMEOUT_S = 60


def _children(pid: int) -> set[int]:
    """The supervisor's engine and worker processes (not multiprocessing's resource tracker)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and b"spawn_main" in cmdline:
            found.add(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def _wait_health(port: int, status: int, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while (code := await asyncio.to_thread(_health, port)) != status:
        assert time.monotonic() < deadline, f"/health stayed {code}, expected {status}"
        await asyncio.sleep(0.2)


async def _open(http: aiohttp.ClientSession, port: int) -> DuplexClient:
    return await open_session(http, f"http://127.0.0.1:{port}")


async def _two_workers(http: aiohttp.ClientSession, port: int) -> tuple[DuplexClient, DuplexClient]:
    """Open sessions until two live on different workers (the kernel spreads connections)."""
    first = await _open(http, port)
    for _ in range(40):
        other = await _open(http, port)
        if other.worker != first.worker:
            return first, other
        await other.close()
    pytest.fail("every connection landed on one worker")


@pytest.fixture
def server():
    port = _free_port()
    proc = subprocess.Popen(
        [*CLI, "serve", "--engine", "loopback", "--workers", "2", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=CLEAN_ENV,
    )
    try:
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


async def test_a_killed_worker_loses_only_its_sessions_and_comes_back(server) -> None:
    _proc, port = server
    await _wait_health(port, 200)
    async with aiohttp.ClientSession() as http:
        doomed, survivor = await _two_workers(http, port)
        assert await echoes_again(survivor)
        os.kill(doomed.worker_pid, signal.SIGKILL)
        await asyncio.wait_for(doomed.closed.wait(), 10)
        assert await echoes_over(survivor, 1.0) >= 8, "the other worker's session stalled"
        assert not survivor.closed.is_set() and survivor.errors == []
        # The supervisor starts a new worker: eventually a connection lands on a new pid.
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            client = await _open(http, port)
            await client.close()
            if client.worker_pid not in (doomed.worker_pid, survivor.worker_pid):
                break
            assert time.monotonic() < deadline, "the killed worker was not replaced"
            await asyncio.sleep(0.2)
        await survivor.close()


async def test_a_resume_the_kernel_hands_to_the_other_worker_reaches_the_session(server) -> None:
    """The session lives in the worker that opened it; a resume socket that lands on the other
    worker is relayed there (``web/peers``): resumed, journal replayed, the same engine slot."""
    _, port = server
    await _wait_health(port, 200)
    base = f"http://127.0.0.1:{port}"

    async def on_the_other_worker(first: aiohttp.ClientWebSocketResponse) -> aiohttp.ClientWebSocketResponse:
        owner = first._response.headers["X-Rtserve-Worker"]
        for _ in range(40):
            ws = await http.ws_connect(f"{base}/v1/realtime?duplex=1&autostart=0")
            if ws._response.headers["X-Rtserve-Worker"] != owner:
                return ws
            await ws.close()
        pytest.fail("every connection landed on one worker")

    async with aiohttp.ClientSession() as http:
        result = await drop_and_resume(http, base, on_the_other_worker)
    assert result.resumed["type"] == "session.resumed", result.resumed
    assert result.resumed["session_id"] == result.created["session"]["id"]
    assert echoed_tags(result.replayed)[-3:] == [11, 12, 13] and echoed_tags(result.flowing)[-1] == 21
    # The owner's journal, continued: a session opened anew would start its sequence again.
    seqs = [e["server_event_seq"] for e in result.replayed + result.flowing]
    assert seqs == list(range(result.last_seq + 1, result.last_seq + 1 + len(seqs)))


def _peer_socket(tag: str) -> str:
    """The worker's peer socket (``web/peers``), found by the tag in its session ids."""
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) == 8 and fields[7].endswith(f"/{tag}.sock"):
            return fields[7]
    raise AssertionError(f"no peer socket for front-end {tag}")


async def test_a_drained_worker_finishes_its_session_and_leaves_for_good(server) -> None:
    proc, port = server
    await _wait_health(port, 200)
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        clients = [await open_session(http, base)]
        while len({c.worker for c in clients}) < 2:
            assert len(clients) < 40, "every connection landed on one worker"
            clients.append(await open_session(http, base))
        kept, *others = clients
        drained = kept.worker
        survivor = next(c for c in others if c.worker != drained)
        for client in others:
            if client is not survivor:
                await client.end()
        path = _peer_socket(kept.first["session"]["id"].split("-")[1])
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path)) as peer:
            async with peer.post("http://peer/_rtserve/drain", json={"deadline_s": 60}) as response:
                assert response.status == 202 and (await response.json())["sessions"] == 1
        assert await echoes_again(kept) and not kept.errors  # its session goes on
        await kept.end()
        pid = int(drained.split(":")[1])
        deadline = time.monotonic() + START_TIMEOUT_S
        while _alive(pid):
            assert time.monotonic() < deadline, "the drained worker did not leave"
            await asyncio.sleep(0.1)
        assert len(_children(proc.pid)) == 2  # the engine and the other worker: no replacement
        for _ in range(10):  # its socket is closed: every new connection goes to the other worker
            client = await open_session(http, base)
            assert client.admitted and client.worker != drained
            await client.close()
        assert await echoes_again(survivor) and not survivor.errors
        await survivor.close()
        await kept.close()


async def test_a_killed_engine_ends_sessions_with_engine_failure_and_health_recovers(server) -> None:
    proc, port = server
    await _wait_health(port, 200)
    async with aiohttp.ClientSession() as http:
        a, b = await _two_workers(http, port)
        assert await echoes_again(a) and await echoes_again(b)  # both live: one still opening gets engine_unavailable
        engine = (_children(proc.pid) - {a.worker_pid, b.worker_pid}).pop()
        os.kill(engine, signal.SIGKILL)
        for client in (a, b):
            await asyncio.wait_for(client.closed.wait(), 10)
            assert any(e.get("code") == "engine_failure" for e in client.errors), client.errors
        await _wait_health(port, 503, timeout_s=10)
        await _wait_health(port, 200)  # from any worker: it asks the other (their links are back, both)
        a, b = await _two_workers(http, port)
        assert await echoes_again(a) and await echoes_again(b), (a.errors, b.errors)
        await a.close()
        await b.close()


def _started(proc: subprocess.Popen, port: int) -> set[int]:
    deadline = time.monotonic() + START_TIMEOUT_S
    while _health(port) != 200:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    children = _children(proc.pid)
    assert len(children) == 3  # the engine process and two workers
    return children


def _all_gone(pids: set[int], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_sigterm_stops_every_process_and_exits_0(server) -> None:
    proc, port = server
    children = _started(proc, port)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert _all_gone(children, 10)


def test_a_sigkilled_supervisor_leaves_no_orphans(server) -> None:
    proc, port = server
    children = _started(proc, port)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert _all_gone(children, 10), "children outlived a SIGKILLed supervisor"


def test_a_package_missing_from_the_install_stops_the_server_instead_of_restarting_workers(tmp_path) -> None:
    """A worker that cannot import the app would fail the same way after every restart: the
    server exits 2 with the reason in one line, not a crash loop that never becomes ready."""
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        "class Missing(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'aioice':\n"
        "            raise ModuleNotFoundError(\"No module named 'aioice'\")\n"
        "sys.meta_path.insert(0, Missing())\n"
    )
    env = {**CLEAN_ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), CLEAN_ENV.get("PYTHONPATH")]))}
    out = subprocess.run(
        [*CLI, "serve", "--engine", "loopback", "--workers", "2", "--port", str(_free_port())],
        capture_output=True,
        text=True,
        env=env,
        timeout=START_TIMEOUT_S,
    )
    assert out.returncode == 2
    assert "rtserve: a worker cannot start: No module named 'aioice'" in out.stderr
    assert "Traceback" not in out.stderr


async def test_every_process_keeps_what_it_loaded_out_of_garbage_collections(server) -> None:
    """A full collection over the startup heap (~80 ms with torch loaded) would stall every session
    of a process at once; the engine process and each worker freeze that heap once serving."""
    _proc, port = server
    await _wait_health(port, 200)
    every_process = {
        "rtserve_gc_frozen_objects",
        'rtserve_gc_frozen_objects{worker="0"}',
        'rtserve_gc_frozen_objects{worker="1"}',
    }
    deadline = time.monotonic() + START_TIMEOUT_S
    async with aiohttp.ClientSession() as http:
        while True:  # workers push their metrics now and then; the engine process freezes once its policy loaded
            async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                text = await response.text()
            frozen = {
                line.split(" ")[0]: float(line.split(" ")[1])
                for line in text.splitlines()
                if line.startswith("rtserve_gc_frozen_objects")
            }
            settled = set(frozen) >= every_process and min(frozen.values()) > 10_000
            if settled or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    assert set(frozen) >= every_process, frozen
    assert min(frozen.values()) > 10_000, frozen
