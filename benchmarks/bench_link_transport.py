"""What one tick's exchange across the engine link costs, per transport (issue 13: "pick the
transport by measurement").

A worker process and an engine process trade one tick's batches back to back: the worker sends
``FRAMES_IN`` (``--sessions`` chunks of 80 ms float32 audio at 24 kHz), the engine answers with
``EVENTS_OUT`` (one ``OutputAudio`` per session, as the lockstep engine forwards them). Both
messages are the link's real tuples. Transports compared:

* ``unix-pickle``: what the link does (``engines/remote/wire.py``): one asyncio Unix socket
  stream, length-prefixed protocol-4 pickles;
* ``zmq-oob``: vLLM's engine-core transport: pyzmq ``PAIR`` sockets over ``ipc://``, the tuple
  pickled with protocol 5 and every array sent as its own zero-copy frame (out of band);
* ``unix-raw``: the same stream, a batch sent as a small pickled index (handles, lengths, the
  events' fields) followed by all its audio as raw bytes, one copy out per session;
* ``shm-doorbell``: the audio written into a shared-memory block per direction, only a small
  index (handles, lengths, the events' fields) pickled over the Unix socket as the doorbell;
  the receiver copies its audio out (a served link would reuse the block every tick, so it
  would need two per direction; the exchange here is strictly alternating, one is enough).

Reported per transport and batch size: round trip of the exchange (worker send -> engine
decode -> engine encode/send -> worker decode), p50 / p99 in microseconds, and the CPU each
process spends per exchange (``time.process_time``). The engine process's loop is shared by
every worker (one exchange per worker per tick), so its CPU per exchange is what bounds
the workers one engine can serve.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_link_transport.py
    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_link_transport.py --sessions 32 --exchanges 500
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import pickle
import platform
import tempfile
import time
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import zmq
import zmq.asyncio

from rtserve.engines.events import OutputAudio
from rtserve.engines.remote.wire import Kind, encode, read_message

RESULTS = Path(__file__).resolve().parent / "results" / "bench_link_transport.json"
FRAME = 1920  # 80 ms at 24 kHz
WARMUP = 100


def frames_in(sessions: int) -> tuple[Any, ...]:
    return (Kind.FRAMES_IN, [(handle, np.random.rand(FRAME).astype(np.float32)) for handle in range(sessions)])


def events_out(frames: list[tuple[int, npt.NDArray[np.float32]]]) -> tuple[Any, ...]:
    """The engine's answer: each session's frame as the lockstep engine forwards it."""
    return (
        Kind.EVENTS_OUT,
        [
            (handle, OutputAudio(pcm=pcm, epoch=0, text=None, tick_due=time.monotonic(), input_samples=FRAME))
            for handle, pcm in frames
        ],
        time.monotonic(),
    )


class Channel(Protocol):
    """One side of a transport: send a link message, receive the next one."""

    async def send(self, message: tuple[Any, ...]) -> None: ...

    async def receive(self) -> tuple[Any, ...]: ...

    def close(self) -> None: ...


class UnixPickle:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def send(self, message: tuple[Any, ...]) -> None:
        self.writer.write(encode(message))

    async def receive(self) -> tuple[Any, ...]:
        message = await read_message(self.reader)
        assert message is not None
        return message

    def close(self) -> None:
        self.writer.close()


class ZmqOutOfBand:
    def __init__(self, socket: zmq.asyncio.Socket) -> None:
        self.socket = socket

    async def send(self, message: tuple[Any, ...]) -> None:
        buffers: list[pickle.PickleBuffer] = []
        head = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
        await self.socket.send_multipart([head, *buffers], copy=False)

    async def receive(self) -> tuple[Any, ...]:
        head, *buffers = await self.socket.recv_multipart(copy=False)
        message: tuple[Any, ...] = pickle.loads(head.buffer, buffers=[frame.buffer for frame in buffers])
        return message

    def close(self) -> None:
        self.socket.close(linger=0)


def split_batch(message: tuple[Any, ...]) -> tuple[tuple[Any, ...], list[npt.NDArray[np.float32]]]:
    """A batch as a small pickled index (handles, lengths, the events' fields) and its audio."""
    kind, items, *rest = message
    index, audio = [], []
    for handle, item in items:
        event = isinstance(item, OutputAudio)
        pcm = item.pcm if event else item
        index.append((handle, pcm.size, (item.epoch, item.text, item.tick_due, item.input_samples) if event else None))
        audio.append(pcm)
    return (kind, index, *rest), audio


def join_batch(head: tuple[Any, ...], audio: npt.NDArray[np.float32]) -> tuple[Any, ...]:
    kind, index, *rest = head
    items, at = [], 0
    for handle, size, fields in index:
        pcm = audio[at : at + size].copy()
        items.append((handle, pcm if fields is None else OutputAudio(pcm, fields[0], None, *fields[1:])))
        at += size
    return (kind, items, *rest)


def is_batch(message: tuple[Any, ...]) -> bool:
    return message[0] is Kind.FRAMES_IN or message[0] is Kind.EVENTS_OUT


class UnixRaw(UnixPickle):
    """The same stream; a batch goes as its pickled index followed by its audio's raw bytes."""

    async def send(self, message: tuple[Any, ...]) -> None:
        if not is_batch(message):
            return await super().send(message)
        head, audio = split_batch(message)
        raw = np.concatenate(audio)
        self.writer.write(encode((head[0], head, raw.nbytes)))  # the index, then its audio's bytes
        self.writer.write(raw.data.cast("B"))  # bytes, not float items: the transport counts len()

    async def receive(self) -> tuple[Any, ...]:
        message = await super().receive()
        if not is_batch(message):
            return message
        raw = await self.reader.readexactly(message[2])
        return join_batch(message[1], np.frombuffer(raw, np.float32))


class ShmDoorbell:
    """Audio through a shared block per direction; the pickled index rings the doorbell."""

    def __init__(self, stream: UnixPickle, outbound: SharedMemory, inbound: SharedMemory, owner: bool) -> None:
        self.stream, self.outbound, self.inbound, self.owner = stream, outbound, inbound, owner
        self.out_view: npt.NDArray[np.float32] = np.ndarray((outbound.size // 4,), np.float32, outbound.buf)
        self.in_view: npt.NDArray[np.float32] = np.ndarray((inbound.size // 4,), np.float32, inbound.buf)

    async def send(self, message: tuple[Any, ...]) -> None:
        if not is_batch(message):
            return await self.stream.send(message)  # control messages as they are
        head, audio = split_batch(message)
        at = 0
        for pcm in audio:
            self.out_view[at : at + pcm.size] = pcm
            at += pcm.size
        await self.stream.send(head)

    async def receive(self) -> tuple[Any, ...]:
        message = await self.stream.receive()
        return join_batch(message, self.in_view) if is_batch(message) else message

    def close(self) -> None:
        self.stream.close()
        self.out_view = self.in_view = None  # type: ignore[assignment]  # views first, then the blocks
        for block in (self.outbound, self.inbound):
            block.close()
            if self.owner:
                block.unlink()


# ---------------------------------------------------------------------------- the two processes


async def open_channel(transport: str, place: str, sessions: int, engine_side: bool) -> Channel:
    """Connect (worker) or accept (engine) the transport's channel at ``place``."""
    if transport == "zmq-oob":
        socket = zmq.asyncio.Context.instance().socket(zmq.PAIR)
        (socket.bind if engine_side else socket.connect)(f"ipc://{place}.zmq")
        return ZmqOutOfBand(socket)
    stream = await _unix_stream(f"{place}.sock", engine_side)
    if transport == "unix-pickle":
        return stream
    if transport == "unix-raw":
        return UnixRaw(stream.reader, stream.writer)
    size = sessions * FRAME * 4
    folder = os.path.basename(os.path.dirname(place))  # unique per point
    names = (f"{folder}-w2e", f"{folder}-e2w")
    if engine_side:
        blocks = [SharedMemory(name, create=True, size=size) for name in names]
        await stream.send((Kind.HELLO, names))  # the worker attaches once they exist
        return ShmDoorbell(stream, outbound=blocks[1], inbound=blocks[0], owner=True)
    await stream.receive()
    return ShmDoorbell(stream, outbound=SharedMemory(names[0]), inbound=SharedMemory(names[1]), owner=False)


async def _unix_stream(path: str, serve: bool) -> UnixPickle:
    if not serve:
        for _ in range(200):
            try:
                return UnixPickle(*await asyncio.open_unix_connection(path))
            except (FileNotFoundError, ConnectionRefusedError):
                await asyncio.sleep(0.01)
        raise RuntimeError(f"no engine at {path}")
    accepted: asyncio.Future[UnixPickle] = asyncio.get_running_loop().create_future()
    server = await asyncio.start_unix_server(lambda r, w: accepted.set_result(UnixPickle(r, w)), path)
    try:
        return await accepted
    finally:
        server.close()


def engine_process(transport: str, place: str, sessions: int, exchanges: int) -> None:
    async def serve() -> None:
        channel = await open_channel(transport, place, sessions, engine_side=True)
        cpu_started = 0.0
        for i in range(exchanges + WARMUP):
            if i == WARMUP:
                cpu_started = time.process_time()  # the whole process: zmq's I/O thread too
            message = await channel.receive()
            await channel.send(events_out(message[1]))
        cpu_s = time.process_time() - cpu_started
        await channel.send((Kind.RESULT, None, cpu_s / exchanges * 1e6))
        await channel.receive()  # the worker's goodbye: the shared blocks stay until it detached
        channel.close()

    asyncio.run(serve())


async def worker(transport: str, place: str, sessions: int, exchanges: int) -> dict[str, float]:
    channel = await open_channel(transport, place, sessions, engine_side=False)
    batch = frames_in(sessions)
    round_trips: list[float] = []
    cpu_started = 0.0
    for i in range(exchanges + WARMUP):
        if i == WARMUP:
            cpu_started = time.process_time()
        started = time.perf_counter()
        await channel.send(batch)
        reply = await channel.receive()
        round_trips.append(time.perf_counter() - started)
        assert reply[0] is Kind.EVENTS_OUT and len(reply[1]) == sessions
    worker_cpu_s = time.process_time() - cpu_started
    np.testing.assert_array_equal(reply[1][-1][1].pcm, batch[1][-1][1])  # the audio made it both ways
    engine_cpu_us = (await channel.receive())[2]
    await channel.send((Kind.HELLO, None))
    channel.close()
    measured = np.array(round_trips[WARMUP:]) * 1e6
    return {
        "round_trip_p50_us": float(np.percentile(measured, 50)),
        "round_trip_p99_us": float(np.percentile(measured, 99)),
        "worker_cpu_us": worker_cpu_s / exchanges * 1e6,
        "engine_cpu_us": engine_cpu_us,
    }


def run_point(transport: str, sessions: int, exchanges: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rtlink") as folder:
        place = os.path.join(folder, "link")
        engine = multiprocessing.get_context("spawn").Process(
            target=engine_process, args=(transport, place, sessions, exchanges)
        )
        engine.start()
        try:
            figures = asyncio.run(worker(transport, place, sessions, exchanges))
        finally:
            engine.join(30)
            if engine.is_alive():
                engine.kill()
    return {
        "transport": transport,
        "sessions": sessions,
        "exchanges": exchanges,
        "bytes_per_direction": sessions * FRAME * 4,
        **figures,
    }


TRANSPORTS = ("unix-pickle", "unix-raw", "zmq-oob", "shm-doorbell")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[32, 64], help="sessions per worker")
    parser.add_argument("--exchanges", type=int, default=2000, help="measured exchanges per point")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the transports (noise)")
    args = parser.parse_args()

    rows: list[dict[str, Any]] = []
    for _ in range(args.rounds):  # alternating, so a noisy minute hits every transport alike
        for sessions in args.sessions:
            for transport in TRANSPORTS:
                rows.append(run_point(transport, sessions, args.exchanges))
    summary = []
    print("| transport | sessions | KiB each way | round trip p50 / p99 us | worker CPU us | engine CPU us |")
    print("|---|---|---|---|---|---|")
    for sessions in args.sessions:
        for transport in TRANSPORTS:
            runs = [r for r in rows if r["transport"] == transport and r["sessions"] == sessions]
            median = {
                key: float(np.median([r[key] for r in runs]))
                for key in ("round_trip_p50_us", "round_trip_p99_us", "worker_cpu_us", "engine_cpu_us")
            }
            summary.append({"transport": transport, "sessions": sessions, **median})
            print(
                f"| {transport} | {sessions} | {sessions * FRAME * 4 // 1024} | {median['round_trip_p50_us']:.0f} / "
                f"{median['round_trip_p99_us']:.0f} | {median['worker_cpu_us']:.0f} | {median['engine_cpu_us']:.0f} |"
            )
    print(f"(medians over {args.rounds} alternating rounds of {args.exchanges} exchanges; CPU per exchange)")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "bench_link_transport",
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                    "zmq": zmq.zmq_version(),
                },
                "summary": summary,
                "runs": rows,
            },
            indent=1,
        )
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
