"""The engine-client wire: typed messages between front-end workers and the engine process.

One ordered byte stream per worker (a Unix socket today; ``EngineLink`` takes any
``connect()`` giving asyncio streams, so a TCP socket to an engine process on another host
needs no change in the front-ends). Each message is a 4-byte
big-endian length and a pickled tuple whose first item is a ``Kind``. The Unix socket is
private to one server (a socket in a 0700 directory), so pickle is trusted there; over TCP
(engines as Ray actors, ``rtserve/cluster``) both ends first prove a shared secret
(``cluster/auth.py``) and no message is read from a peer that has not.

Two paths share the stream, as in vLLM's engine core (``EngineCoreRequestType``):

* the data path, batched per tick: ``FRAMES_IN`` carries every session's audio a worker
  received since its last flush (one message per worker per tick), ``EVENTS_OUT``
  everything the engine produced for that worker's sessions (one per tick);
* the control path, sent at once and never batched: calls with replies (open, commit,
  close, turn-engine streams, policy calls) and one-way commands (epochs, clears).
"""

from __future__ import annotations

import asyncio
import enum
import pickle
import struct
import time
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry, Counter, Histogram

from rtserve.engines.errors import CapacityExhausted, EngineError
from rtserve.engines.events import OutputAudio
from rtserve.errors import ENGINE_ERROR

_HEADER = struct.Struct(">I")
MAX_MESSAGE_BYTES = 256 * 1024 * 1024


class Kind(enum.IntEnum):
    HELLO = 1  # worker -> engine: (worker_index,)
    STATUS = 2  # engine -> worker: (EngineStatus,)
    CALL = 3  # (call_id | None, target, method, args): None = no reply wanted
    RESULT = 4  # (call_id, value)
    ERROR = 5  # (call_id, RemoteError)
    STREAM_OPEN = 6  # (stream_id, target, method, args, has_input)
    STREAM_INPUT = 7  # (stream_id, item); item None = end of input
    STREAM_ITEM = 8  # (stream_id, item)
    STREAM_END = 9  # (stream_id, RemoteError | None)
    STREAM_CREDIT = 10  # (stream_id, n): the worker consumed n items
    STREAM_CANCEL = 11  # (stream_id,)
    FRAMES_IN = 12  # ([(handle, pcm), ...],)
    # ([(handle, event | int | None), ...], tick_deadline | None, AudioColumns): None event = session ended,
    # an int = row of the columns (``pack_events``)
    EVENTS_OUT = 13
    METRICS = 14  # (worker_index, exposition text)


class RemoteError(EngineError):
    """An engine-side failure carried across the boundary with its stable code."""

    @classmethod
    def wrap(cls, exc: BaseException) -> RemoteError:
        if isinstance(exc, EngineError):
            return cls(str(exc), code=exc.code, param=exc.param)
        return cls("the engine failed", code=ENGINE_ERROR)  # internals stay in the engine's log

    def unwrap(self) -> EngineError:
        if self.code == CapacityExhausted.code:
            return CapacityExhausted(str(self))
        return EngineError(str(self), code=self.code, param=self.param)  # param: the request field at fault

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_error, (str(self), self.code, self.param))


def _rebuild_error(message: str, code: str, param: str | None = None) -> RemoteError:
    return RemoteError(message, code=code, param=param)


def write(writer: asyncio.StreamWriter, message: tuple[Any, ...], metrics: LinkMetrics | None, side: str) -> None:
    started = time.perf_counter()
    writer.write(encode(message))
    if metrics is not None:
        metrics.sent(side, message, time.perf_counter() - started)


# Protocol 4, not 5: a numpy array unpickled from protocol 5 keeps its bytes through a memoryview,
# two objects the garbage collector tracks for as long as the array lives. Realtime sessions keep a
# minute of delivered audio for resumes; with 5 that doubled what every full collection walked
# (tens of milliseconds more, every session of the worker waiting). 4 copies each array once: as fast.
_PICKLE_PROTOCOL = 4


def encode(message: tuple[Any, ...]) -> bytes:
    payload = pickle.dumps(message, protocol=_PICKLE_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


async def read_message(reader: asyncio.StreamReader) -> tuple[Any, ...] | None:
    """The next message, or None at a clean end of stream."""
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ConnectionError("engine stream ended inside a message header") from None
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_MESSAGE_BYTES:
        raise ConnectionError(f"engine message of {size} bytes exceeds {MAX_MESSAGE_BYTES}")
    message: tuple[Any, ...] = pickle.loads(await reader.readexactly(size))
    return message


class AudioColumns(NamedTuple):
    """A batch's ``OutputAudio`` events as columns: all their samples in one array, so a tick's
    frames pickle as one buffer and a few lists instead of an object and an array per session
    (the engine process pickles every worker's batch on its one loop, each tick)."""

    pcm: npt.NDArray[np.float32]  # every event's samples, one after another
    ends: list[int]  # where each event's samples end in ``pcm``
    epochs: list[int]
    response_ids: list[str | None]
    texts: list[str | None]
    ticks_due: list[float | None]
    input_samples: list[int | None]


def pack_events(events: list[tuple[int, Any]]) -> tuple[list[tuple[int, Any]], AudioColumns]:
    """``events`` with each float32 ``OutputAudio`` replaced by its row number in the columns."""
    items: list[tuple[int, Any]] = []
    chunks: list[npt.NDArray[np.float32]] = []
    ends: list[int] = []
    epochs: list[int] = []
    response_ids: list[str | None] = []
    texts: list[str | None] = []
    ticks: list[float | None] = []
    inputs: list[int | None] = []
    end = 0
    for handle, event in events:
        # Exact type: a subclass's extra fields would not survive the columns.
        if type(event) is OutputAudio and isinstance(event.pcm, np.ndarray) and event.pcm.dtype == np.float32:
            items.append((handle, len(chunks)))
            chunks.append(event.pcm)
            end += event.pcm.size
            ends.append(end)
            epochs.append(event.epoch)
            response_ids.append(event.response_id)
            texts.append(event.text)
            ticks.append(event.tick_due)
            inputs.append(event.input_samples)
        else:
            items.append((handle, event))
    pcm = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    return items, AudioColumns(pcm, ends, epochs, response_ids, texts, ticks, inputs)


def unpack_events(
    items: list[tuple[int, Any]], columns: AudioColumns, clock_offset_s: float = 0.0
) -> list[tuple[int, Any]]:
    """``pack_events`` undone. Each frame gets its own copy of its samples: a view would keep the
    whole batch's buffer alive as long as any one frame (realtime sessions keep a minute).
    ``clock_offset_s`` (the engine's monotonic clock minus ours) puts ``tick_due`` on our clock."""
    c = columns
    events: list[tuple[int, Any]] = []
    for handle, event in items:
        if type(event) is int:
            start = c.ends[event - 1] if event else 0
            event = OutputAudio(
                pcm=c.pcm[start : c.ends[event]].copy(),
                epoch=c.epochs[event],
                response_id=c.response_ids[event],
                text=c.texts[event],
                tick_due=None if (due := c.ticks_due[event]) is None else due - clock_offset_s,
                input_samples=c.input_samples[event],
            )
        events.append((handle, event))
    return events


class LinkMetrics:
    """What crossing the process boundary costs: per-tick batches and their encode+write time,
    by side (``worker`` sends audio, ``engine`` sends events)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.messages = Counter(
            "rtserve_engine_link_messages",
            "Messages sent over the engine link by kind",
            ["side", "kind"],
            registry=registry,
        )
        self.batch_seconds = Histogram(
            "rtserve_engine_link_batch_send_seconds",
            "Encoding and writing one per-tick batch (FRAMES_IN or EVENTS_OUT)",
            ["side"],
            buckets=_IPC_BUCKETS,
            registry=registry,
        )
        self.batch_items = Histogram(
            "rtserve_engine_link_batch_items",
            "Sessions' audio chunks or events in one per-tick batch",
            ["side"],
            buckets=_ITEM_BUCKETS,
            registry=registry,
        )

    def sent(self, side: str, message: tuple[Any, ...], seconds: float) -> None:
        kind = message[0]
        self.messages.labels(side, kind.name.lower()).inc()
        if kind is Kind.FRAMES_IN or kind is Kind.EVENTS_OUT:
            self.batch_seconds.labels(side).observe(seconds)
            self.batch_items.labels(side).observe(len(message[1]))


_IPC_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025)
_ITEM_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
