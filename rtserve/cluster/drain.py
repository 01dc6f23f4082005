"""``rtserve drain --ray-address ADDR (--engine NAME | --front-end NAME) [--deadline S]``.

An engine: the actor takes no new sessions (front-ends route new ones to the other engines)
and leaves once its open sessions end, or at the deadline. A front-end (its tag, or a host
name for every front-end on that host): found in the cluster's directory of front-ends,
told over its peer site (a request signed with the cluster secret) to admit no new
session and to stop once its sessions end, or at the deadline. Either way this waits until
what was drained has left.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import ray

from rtserve.config import load_config

log = logging.getLogger("rtserve.drain")

_POLL_S = 0.5
_GRACE_S = 30.0  # beyond the deadline: closing the link and stopping the engines
_REQUEST_TIMEOUT_S = 10.0


def drain(
    address: str, namespace: str, deadline_s: float, *, engine: str | None = None, front_end: str | None = None
) -> int:
    """Exit status: 0 once it left, 1 when no such engine or front-end (or cluster), 3 when it
    is still there after its deadline."""
    try:
        ray.init(address=address, namespace=namespace, log_to_driver=False, logging_level=logging.WARNING)
    except ConnectionError as exc:
        log.error("cannot reach the Ray cluster at %s: %s", address, (str(exc).splitlines() or [""])[0])
        return 1
    try:
        if engine is not None:
            return _drain_engine(namespace, engine, deadline_s)
        assert front_end is not None
        return _drain_front_ends(namespace, front_end, deadline_s)
    finally:
        ray.shutdown()


def _drain_engine(namespace: str, engine: str, deadline_s: float) -> int:
    try:
        actor: Any = ray.get_actor(engine, namespace=namespace)  # a handle's methods are untyped
    except ValueError:
        log.error("no engine actor named %r in namespace %r", engine, namespace)
        return 1
    open_now = ray.get(actor.drain.remote(deadline_s))
    log.info("engine %s draining: %d sessions open; it leaves when they end or in %g s", engine, open_now, deadline_s)

    def gone() -> bool:
        try:
            ray.get_actor(engine, namespace=namespace)
        except ValueError:
            return True
        return False

    return _wait_until(gone, f"engine {engine}", deadline_s)


def _drain_front_ends(namespace: str, name: str, deadline_s: float) -> int:
    """Every front-end whose tag or host name is ``name``."""
    from rtserve.cluster.directory import DIRECTORY_NAME, peer_signer
    from rtserve.web.peers.site import DRAIN_ROUTE

    try:
        directory: Any = ray.get_actor(DIRECTORY_NAME, namespace=namespace)
    except ValueError:
        log.error("no front-end has joined namespace %r", namespace)
        return 1
    chosen = {
        tag: entry for tag, entry in ray.get(directory.front_ends.remote()).items() if name in (tag, entry["hostname"])
    }
    if not chosen:
        log.error("no front-end with tag or host %r in namespace %r", name, namespace)
        return 1
    config = load_config(environ=dict(os.environ))  # the cluster secret, as the front-ends have it
    if config.cluster.secret is None:
        log.error("set RTSERVE_CLUSTER__SECRET (the front-ends' cluster.secret): drain requests are signed with it")
        return 1
    signer = peer_signer(config)
    for tag, entry in chosen.items():
        request = urllib.request.Request(
            f"http://{entry['host']}:{entry['port']}{DRAIN_ROUTE}",
            method="POST",
            data=json.dumps({"deadline_s": deadline_s}).encode(),
            headers={"Content-Type": "application/json", "X-Rtserve-Peer": signer.sign("POST", DRAIN_ROUTE)},
        )
        try:
            with urllib.request.urlopen(request, timeout=_REQUEST_TIMEOUT_S) as response:
                answer = json.load(response)
        except (urllib.error.URLError, OSError) as exc:
            log.error("front-end %s at %s:%d did not take the drain: %s", tag, entry["host"], entry["port"], exc)
            return 1
        log.info(
            "front-end %s (%s, pid %s) draining: %d sessions open; it leaves when they end or in %g s",
            tag,
            entry["hostname"],
            entry["pid"],
            answer["sessions"],
            answer["deadline_s"],
        )

    def gone() -> bool:
        return not set(chosen) & set(ray.get(directory.front_ends.remote()))

    return _wait_until(gone, f"front-end {name}", deadline_s)


def _wait_until(gone: Callable[[], bool], what: str, deadline_s: float) -> int:
    give_up = time.monotonic() + deadline_s + _GRACE_S
    while time.monotonic() < give_up:
        if gone():
            log.info("%s left the cluster", what)
            return 0
        time.sleep(_POLL_S)
    log.error("%s is still there %g s after its deadline", what, _GRACE_S)
    return 3
