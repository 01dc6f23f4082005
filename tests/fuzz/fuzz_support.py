"""What every socket fuzz module shares (issue 17, "Done when"): the real app served on
127.0.0.1 in a thread of its own, so hypothesis's synchronous tests drive it through real
sockets with ordinary clients; the server's log at WARNING and above, captured; a canary
session opened before the fuzzing that must still work after it; the process's RSS.

What a fuzzed socket may answer: a typed error (a snake_case ``code`` other than
``internal_error``, a message with no traceback, path or exception text), a clean close
(a close frame with a code other than 1011, internal error) or a 2xx-4xx HTTP status.
Anything at ERROR in the log, or any record carrying an exception, is a failure.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import logging
import os
import re
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import numpy as np
from aiohttp import web
from hypothesis import HealthCheck, settings

from rtserve.config import ServerConfig, load_config
from tests.support import serve_app
from tests.web.realtime_support import b64_pcm16, frame_tag, pcm16_b64, tagged_frame

T = TypeVar("T")

# Each test module stays within seconds: the whole fuzz suite is meant to run in ~2 minutes on
# 2 cores, with the rest of the suite.
FUZZ = settings(
    deadline=None,
    max_examples=int(os.environ.get("RTSERVE_FUZZ_EXAMPLES", "60")),
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
WAIT_S = 10.0  # bound on every wait for the server
RSS_GROWTH_BOUND = 256 * 1024 * 1024  # a module's fuzzing may not grow the process by more

# 1013 "try again later" is how a full server refuses a session (resource_exhausted).
ALLOWED_CLOSE_CODES = frozenset({1000, 1001, 1002, 1003, 1007, 1008, 1009, 1013}) | frozenset(range(4000, 5000))
_CODE = re.compile(r"[a-z][a-z0-9_]*\Z")
# What a message written for a client must not contain: tracebacks, source paths, exception reprs.
_INTERNAL = re.compile(r"Traceback|File \"|\.py\b|Error\(|Exception\(|<[a-zA-Z_.]+ object at 0x")


def check_error(code: object, message: object) -> None:
    assert isinstance(code, str) and _CODE.match(code) and code != "internal_error", (code, message)
    assert isinstance(message, str) and not _INTERNAL.search(message), (code, message)


def check_close_code(code: int | None) -> None:
    assert code in ALLOWED_CLOSE_CODES, f"closed with {code}"


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class LogWatch(logging.Handler):
    """Records at WARNING and above from every logger of the process (the server's thread
    included); ``problems`` are those at ERROR, or carrying an exception, a traceback or
    exception text."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: collections.deque[logging.LogRecord] = collections.deque(maxlen=1000)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def problems(self) -> list[str]:
        """The problems since the last call (each example is judged on its own records)."""
        out = []
        records, self.records = list(self.records), collections.deque(maxlen=1000)
        for record in records:
            text = record.getMessage()
            if record.levelno >= logging.ERROR or record.exc_info or record.stack_info or _INTERNAL.search(text):
                out.append(f"{record.levelname} {record.name}: {text[:300]} exc={record.exc_info!r:.300}")
        return out


class DuplexCanary:
    """A full-duplex realtime session on the loopback engine, opened before fuzzing: it
    drains everything the server sends and, when asked, proves it still echoes audio."""

    def __init__(self) -> None:
        self._tags: set[int] = set()
        self._seen = asyncio.Event()
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self.closed_with: int | None = None

    async def open(self, base: str) -> None:
        self._http = aiohttp.ClientSession()
        self._ws = await self._http.ws_connect(base.replace("http://", "ws://") + "/v1/realtime?duplex=1")
        self._reader = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        assert self._ws is not None
        async for message in self._ws:
            if message.type is not aiohttp.WSMsgType.TEXT:
                continue
            event = message.json()
            if event.get("type") == "response.output_audio.delta":
                tag = frame_tag(b64_pcm16(event["delta"]))
                if tag is not None:
                    self._tags.add(tag)
                    self._seen.set()
        self.closed_with = self._ws.close_code

    async def echoes(self, tag: int) -> bool:
        assert self._ws is not None
        if self._ws.closed:
            return False
        await self._ws.send_json({"type": "input_audio_buffer.append", "audio": pcm16_b64(tagged_frame(tag))})
        try:
            async with asyncio.timeout(WAIT_S):
                while tag not in self._tags:
                    self._seen.clear()
                    await self._seen.wait()
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._http is not None:
            await self._http.close()


class FuzzServer:
    """The app in its own thread and event loop; ``run`` executes a coroutine there."""

    def __init__(self, make_app: Callable[[], Awaitable[web.Application]], *, canary: bool = True) -> None:
        self._make_app = make_app
        self._loop = asyncio.new_event_loop()
        self._ready: Future[str] = Future()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._serve, name="fuzz-server", daemon=True)
        self.base = ""
        self.ws_base = ""
        self.canary = DuplexCanary() if canary else None  # needs a session engine
        self.log = LogWatch()
        self.rss_start = 0

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        try:
            app = await self._make_app()
            async with serve_app(app) as base:
                await _wait_healthy(base)
                self._ready.set_result(base)
                await self._stop.wait()
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
            raise

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = WAIT_S * 2) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self) -> None:
        logging.getLogger().addHandler(self.log)
        self._thread.start()
        self.base = self._ready.result(60)
        self.ws_base = self.base.replace("http://", "ws://")
        if self.canary is not None:
            self.run(self.canary.open(self.base))
            assert self.run(self.canary.echoes(1)), "the canary does not work before fuzzing"
        self.rss_start = rss_bytes()

    def stop(self) -> None:
        try:
            if self.canary is not None:
                self.run(self.canary.close())
        finally:
            assert self._stop is not None
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(30)
            logging.getLogger().removeHandler(self.log)

    def assert_clean_log(self) -> None:
        problems = self.log.problems()
        assert not problems, "\n".join(problems)

    def assert_healthy_after_fuzzing(self) -> None:
        """The module's closing check: canary, log, RSS."""
        if self.canary is not None:
            assert self.run(self.canary.echoes(2)), (
                f"the canary stopped working (closed with {self.canary.closed_with})"
            )
        self.assert_clean_log()
        grown = rss_bytes() - self.rss_start
        assert grown < RSS_GROWTH_BOUND, f"RSS grew by {grown / 2**20:.0f} MiB"


async def _wait_healthy(base: str) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(int(WAIT_S * 20)):
            async with http.get(f"{base}/health") as resp:
                if resp.status == 200:
                    return
            await asyncio.sleep(0.05)
    raise AssertionError("the fuzz server never became healthy")


def fuzz_config(**sections: dict[str, Any]) -> ServerConfig:
    """Loopback engine, room for the canary plus the fuzzed sessions (a dropped duplex session
    frees its slot at once), deadlines that outlast a module."""
    config = load_config(
        environ={},
        overrides={
            "engine": "loopback",
            "lockstep": {"batch_size": 16},
            "sessions": {"disconnect_grace_s": 0.0, "reaper_interval_s": 0.05},
            "moshi": {"idle_timeout_s": 600.0, "open_timeout_s": 600.0},
            "robot": {"idle_timeout_s": 600.0},
            **sections,
        },
    )
    return config


@contextmanager
def fuzz_server(make_app: Callable[[], Awaitable[web.Application]], *, canary: bool = True) -> Iterator[FuzzServer]:
    server = FuzzServer(make_app, canary=canary)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def speech_pcm(samples: int, seed: int = 0) -> np.ndarray:
    """Float PCM in [-0.5, 0.5] with some structure, for valid audio to mutate."""
    rng = np.random.default_rng(seed)
    return (0.3 * np.sin(np.arange(samples) / 7.0) + 0.1 * rng.standard_normal(samples)).astype(np.float32)
