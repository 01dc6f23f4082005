"""``rtserve serve --workers N`` (N > 1): one engine process and N front-end workers.

The layout vLLM adopted once its API server became CPU-bound (``--api-server-count``):
the engine process owns models and device; each worker runs the whole aiohttp app
(transports, codecs, session runners, output buffers) on the one shared port
(``SO_REUSEPORT``: the kernel spreads new connections over the workers) and reaches the
engines through ``EngineLink`` over a Unix socket.

The parent binds one ``SO_REUSEPORT`` listening socket per worker before any child starts
and hands each worker its own: every socket takes its share of connections from the first
moment (none lands on an early worker just because the others were still starting), and a
restarted worker takes over its predecessor's socket, connections queued meanwhile included.

This parent only supervises. A worker that dies loses its own sockets and is started
again; the others keep streaming. An engine process that dies ends its sessions with
``engine_failure`` (the workers see the link break; ``/health`` is 503) and is started
again; the workers reconnect. A worker drained on purpose (``web/peers``: its drain route)
leaves for good: before it stops accepting it has this parent close its copy of its socket
(``ListenerRelease``), so the kernel sends its share to the others and queues none on a socket
nobody accepts from (closed with it, such connections would be reset), and the server exits once
no worker is left. Workers reach each other through sockets in the same
private folder as the engine link, so a ``session.resume`` that the kernel hands to another
worker is relayed to the one that holds the session. SIGTERM/SIGINT drain the workers first
(their sessions close with ``shutdown``), then stop the engine. Children die with this process even if it
is SIGKILLed (``PR_SET_PDEATHSIG``, see ``orphans.py``).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

from rtserve.config import ConfigError, ServerConfig
from rtserve.engines.registry import ENGINES
from rtserve.processes import engine_main, worker_main

log = logging.getLogger(__name__)

_POLL_S = 0.2
_BACKLOG = 1024  # connections a socket queues while its worker starts or restarts
_RESTART_BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 5.0)  # repeated crashes wait longer, never give up
_STABLE_S = 30.0  # a child that lived this long restarts without backoff


@dataclass
class _Child:
    name: str
    target: Any
    args: tuple[Any, ...]
    listener: socket.socket | None = None  # a worker's share of the port (the parent's copy)
    release: worker_main.ListenerRelease | None = None
    process: BaseProcess | None = None
    started_at: float = 0.0
    restarts: int = 0  # consecutive quick crashes

    def start(self, context: Any) -> None:
        self.process = context.Process(target=self.target, args=self.args, name=self.name, daemon=False)
        self.process.start()
        self.started_at = time.monotonic()
        log.info("%s started (pid %s)", self.name, self.process.pid)

    def backoff_s(self) -> float:
        if time.monotonic() - self.started_at > _STABLE_S:
            self.restarts = 0
        delay = _RESTART_BACKOFF_S[min(self.restarts, len(_RESTART_BACKOFF_S) - 1)]
        self.restarts += 1
        return delay


class Supervisor:
    def __init__(self, config: ServerConfig, workers: int, *, engine_process: bool = True) -> None:
        """``engine_process`` False: the engines run elsewhere (Ray actors, ``cluster/``); each
        worker reaches them itself."""
        if config.engine not in ENGINES:  # fail now, not in an engine process restarted forever
            raise ConfigError(
                f"invalid config field 'engine': unknown engine {config.engine!r} (known: {', '.join(sorted(ENGINES))})"
            )
        self.config = config
        self._socket_dir = tempfile.mkdtemp(prefix="rtserve-engine-")  # 0700: the link is private
        socket_path = os.path.join(self._socket_dir, "engine.sock")
        settings = config.model_dump(mode="json")
        self._context = multiprocessing.get_context("spawn")
        parent = os.getpid()
        self._listeners = _listening_sockets(config.host, config.port, workers)
        self._engine = _Child("engine", engine_main.run, (settings, socket_path, parent))
        # The workers reach each other through sockets in the same private folder (web/peers).
        self._workers = []
        for i, listener in enumerate(self._listeners):
            release = worker_main.ListenerRelease(self._context.Event(), self._context.Event())
            args = (settings, socket_path, i, parent, listener, self._socket_dir, release)
            self._workers.append(_Child(f"worker-{i}", worker_main.run, args, listener, release))
        self._stop = threading.Event()
        self._engine_process = engine_process

    @property
    def children(self) -> list[_Child]:
        return [self._engine, *self._workers] if self._engine_process else list(self._workers)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        try:
            for child in self.children:
                child.start(self._context)
            log.info(
                "rtserve listening on http://%s:%d with %d workers and one engine process (engine %s)",
                self.config.host,
                self.config.port,
                len(self._workers),
                self.config.engine,
            )
            return self._watch()
        finally:
            self._shut_down()

    def _watch(self) -> int:
        """Until a stop signal (0) or a configuration or install error (2); restarts what dies."""
        while not self._stop.wait(_POLL_S):
            for child in self._workers:
                if child.release is not None and child.release.asked.is_set():
                    self._release_listener(child)
            for child in self.children:
                process = child.process
                if process is not None and not process.is_alive():
                    if process.exitcode == engine_main.EXIT_CONFIG_ERROR:
                        return 2  # the child printed the one-line reason; a restart would fail the same way
                    # One that gave its socket up cannot be started again on it, whatever its exit.
                    if child is not self._engine and (
                        process.exitcode == worker_main.EXIT_DRAINED or child.listener not in self._listeners
                    ):
                        log.info("%s (pid %s) was drained and left", child.name, process.pid)
                        process.close()
                        child.process = None
                        self._workers.remove(child)
                        self._release_listener(child)
                        if not self._workers:
                            return 0  # every front-end left: so does the server
                        break
                    log.error("%s (pid %s) exited with %s; restarting", child.name, process.pid, process.exitcode)
                    process.close()
                    child.process = None
                    if self._stop.wait(child.backoff_s()):
                        return 0
                    child.start(self._context)
        return 0

    def _release_listener(self, child: _Child) -> None:
        """Close the parent's copy of a leaving worker's socket (once), and tell the worker."""
        if child.listener in self._listeners:
            self._listeners.remove(child.listener)
            child.listener.close()
        if child.release is not None:
            child.release.done.set()

    def _shut_down(self) -> None:
        deadline = time.monotonic() + self.config.sessions.shutdown_timeout_s + 5
        for worker in self._workers:  # the whole server stops: a draining worker need not wait for its socket
            if worker.release is not None:
                worker.release.done.set()
        _terminate([w.process for w in self._workers], deadline)  # sessions close with "shutdown" first
        _terminate([self._engine.process], time.monotonic() + 10)
        for listener in self._listeners:
            listener.close()
        shutil.rmtree(self._socket_dir, ignore_errors=True)


def _listening_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
            address = sock.getsockname()  # port 0: the others share the port the first got
            sock.listen(_BACKLOG)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _terminate(processes: list[BaseProcess | None], deadline: float) -> None:
    alive = [p for p in processes if p is not None and p.is_alive()]
    for process in alive:
        process.terminate()
    for process in alive:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            log.warning("%s did not stop in time; killing it", process.name)
            process.kill()
            process.join(5)
