"""``rtserve drain --ray-address ADDR --engine NAME [--deadline S]``.

Tells the engine actor to take no new sessions (front-ends route new ones to the other
engines) and to leave once its open sessions end, or at the deadline; waits until it left.
"""

from __future__ import annotations

import logging
import time

import ray

log = logging.getLogger("rtserve.drain")

_POLL_S = 0.5
_GRACE_S = 30.0  # beyond the deadline: closing the link and stopping the engines


def drain(address: str, namespace: str, engine: str, deadline_s: float) -> int:
    """Exit status: 0 once the engine left, 1 when no such engine (or cluster), 3 when it is still there."""
    try:
        ray.init(address=address, namespace=namespace, log_to_driver=False, logging_level=logging.WARNING)
    except ConnectionError as exc:
        log.error("cannot reach the Ray cluster at %s: %s", address, (str(exc).splitlines() or [""])[0])
        return 1
    try:
        try:
            actor = ray.get_actor(engine, namespace=namespace)
        except ValueError:
            log.error("no engine actor named %r in namespace %r", engine, namespace)
            return 1
        open_now = ray.get(actor.drain.remote(deadline_s))
        log.info("engine %s draining: %d sessions open; it leaves when they end or in %g s", engine, open_now,
                 deadline_s)
        give_up = time.monotonic() + deadline_s + _GRACE_S
        while time.monotonic() < give_up:
            try:
                ray.get_actor(engine, namespace=namespace)
            except ValueError:
                log.info("engine %s left the cluster", engine)
                return 0
            time.sleep(_POLL_S)
        log.error("engine %s is still there %g s after its deadline", engine, _GRACE_S)
        return 3
    finally:
        ray.shutdown()
