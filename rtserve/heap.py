"""Keep full garbage collections short in long-running server processes.

A full (generation 2) collection walks every object the collector tracks, holding the GIL.
With torch, the models and the app loaded that is a few hundred thousand objects: ~80 ms on
a 2-core machine, during which the process's engine thread does not tick and its event loop
moves no frame, so every session of that process gets ~80 ms of standing input at once (which
the lockstep trim then takes seconds to remove). What exists once a process has loaded lives as
long as the process: ``gc.freeze`` takes it out of the collector's view, so later collections
walk only what was created since (``rtserve_gc_pause_seconds`` shows the pauses).
"""

from __future__ import annotations

import ctypes
import gc
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rtserve.engines.engine_set import EngineSet

_frozen_objects = 0

MALLOC_ARENAS = 2  # glibc malloc arenas of a server process, unless MALLOC_ARENA_MAX says otherwise
_M_ARENA_MAX = -8  # mallopt's parameter number (glibc malloc.h)


def bound_malloc_arenas() -> None:
    """At most ``MALLOC_ARENAS`` glibc malloc arenas in this process and the ones it starts.

    glibc gives each thread that allocates while the others hold theirs a new arena, up to 8 per
    core, each a 64 MiB heap whose freed pages stay resident. The server's threads (codec
    executor, ONNX Runtime's intra-op pool, the TTS and LLM threads, aiortc's) picked up new
    arenas round after round of identical streamed speech: RSS rose in ~25-45 MB steps and was
    not returned (issue 30; ``benchmarks/bench_soak_routes.py``, ``benchmarks/notes/soak_routes.md``).
    With two arenas it rises once while caches warm, then stays flat. An operator's own
    ``MALLOC_ARENA_MAX`` (glibc reads it at process start) is left as it is."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    os.environ["MALLOC_ARENA_MAX"] = str(MALLOC_ARENAS)  # worker and engine processes read it at start
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: its allocator has its own policy
        return
    libc.mallopt(_M_ARENA_MAX, MALLOC_ARENAS)  # this process: only arenas created from now on


def freeze_long_lived() -> None:
    """Everything alive now stays out of later collections (startup garbage is freed first)."""
    global _frozen_objects
    gc.collect()
    gc.freeze()
    _frozen_objects = gc.get_freeze_count()


def frozen_objects() -> int:
    """Objects the last freeze kept out of collections (counted once then: counting walks them
    all, milliseconds for a loaded process, too slow for every metrics scrape)."""
    return _frozen_objects


def freeze_when_ready(engines: EngineSet) -> None:
    """Freeze each time ``engines`` settle: ready, and nothing left loading in the background. The
    session engine is ready before the robot policy has loaded (torch, in a thread): a freeze then
    left that whole import, ~110k objects, for every later full collection to walk (60 ms on 2
    cores, up to 160 ms measured on a busy 16-core host, with every session of the process waiting).
    The same held for a Kyutai STT or TTS engine loading beside a session engine that does not
    need it. Waking from sleep mode loads models again, and settles again."""
    was_settled = False

    def changed() -> None:
        nonlocal was_settled
        settled = engines.settled
        if settled and not was_settled:
            freeze_long_lived()
        was_settled = settled

    engines.on_change(changed)
    changed()
