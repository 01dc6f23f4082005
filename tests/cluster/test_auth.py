"""The engine link over TCP reads no pickle from a peer that has not proven the cluster secret."""

from __future__ import annotations

import asyncio
import pathlib
import time

import pytest

from rtserve.cluster import auth
from rtserve.config import ServerConfig
from rtserve.engines.remote.wire import Kind, encode, read_message
from tests.cluster.engines import SECRET, tcp_connect, tcp_engines


class _Trap:
    """Unpickling this creates a file: the proof that a pickle was read."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (self.path,))


@pytest.fixture
def loopback(config: ServerConfig) -> ServerConfig:
    config.engine = "loopback"
    return config


async def _peer_gets(port: int, opening: bytes) -> bytes:
    """Everything the engine sends a peer that opens with ``opening`` (until it closes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(opening)
    try:
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


@pytest.mark.parametrize("opening", ["pickles_at_once", "wrong_secret"])
async def test_a_peer_without_the_secret_gets_nothing_unpickled(
    loopback: ServerConfig, tmp_path: pathlib.Path, opening: str
) -> None:
    trap = tmp_path / "unpickled"
    evil = encode((Kind.HELLO, _Trap(trap)))
    async with tcp_engines(loopback, 1) as (engine,):
        if opening == "pickles_at_once":  # no handshake at all: a link message straight away
            received = await _peer_gets(engine.port, evil * 4)
        else:  # a handshake with a MAC under another secret, then the pickle
            reader, writer = await asyncio.open_connection("127.0.0.1", engine.port)
            with pytest.raises(auth.HandshakeRefused):
                await auth.connect(reader, writer, b"not-the-cluster-secret", 5.0)
            writer.write(evil)
            received = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            received = b"?" * auth.NONCE_BYTES + received
        assert not trap.exists()
        # Only the engine's nonce came back: no offer, no pickle of any kind, then the close.
        assert len(received) == auth.NONCE_BYTES
        assert not engine.server.links


async def test_both_ends_proving_the_secret_get_the_link_and_the_engine_clock(loopback: ServerConfig) -> None:
    async with tcp_engines(loopback, 1) as (engine,):
        reader, writer = await asyncio.open_connection("127.0.0.1", engine.port)
        offset = await auth.connect(reader, writer, SECRET, 5.0)
        assert offset == 0.0  # one host (one boot id): one monotonic clock
        writer.write(encode((Kind.HELLO, 0)))
        status = await asyncio.wait_for(read_message(reader), 10)
        assert status is not None and status[0] is Kind.STATUS
        assert status[1].capabilities.name == "loopback"
        writer.close()


async def test_a_front_end_with_another_secret_is_refused_at_once(loopback: ServerConfig) -> None:
    async with tcp_engines(loopback, 1) as (engine,):
        started = time.monotonic()
        with pytest.raises(auth.HandshakeRefused):
            await tcp_connect(engine.port, b"another-cluster-secret!!")
        assert time.monotonic() - started < 5


async def test_an_engine_on_another_host_gets_its_clock_offset_from_the_probes(
    loopback: ServerConfig, monkeypatch
) -> None:
    boot_ids = iter([b"engine-host".ljust(36, b"-"), b"front-end-host".ljust(36, b"-")])
    monkeypatch.setattr(auth, "_boot_id", lambda: next(boot_ids))  # the engine's is read first
    async with tcp_engines(loopback, 1) as (engine,):
        reader, writer = await asyncio.open_connection("127.0.0.1", engine.port)
        offset = await auth.connect(reader, writer, SECRET, 5.0)
        writer.close()
    # Both "hosts" share this process's clock: the shortest probe's estimate is within its round trip.
    assert offset != 0.0 and abs(offset) < 0.05
