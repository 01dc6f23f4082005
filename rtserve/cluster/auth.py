"""The engine link's handshake over TCP: both ends prove the cluster secret before a pickle moves.

The link speaks pickles, and unpickling runs code, so an engine actor listening on a
network port must not read a single message from a peer that has not proven the secret.
A mutual HMAC-SHA256 challenge (each side sends a fresh nonce; each answers with the MAC
of both nonces under its role) runs on raw fixed-size bytes; only after both MACs check
does either side hand the stream to the link. The front-end proves itself first, and
checks the engine too, because it unpickles what the engine sends.

After the proofs the front-end learns the engine's monotonic clock: it times its per-tick
uplink by the engine's tick stamps, and another host's monotonic clock has another origin.
On one host (same boot id) the offset is exactly 0; otherwise it is the probe with the
shortest round trip out of a few (NTP's rule: the shortest exchange has the least error).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import struct
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

NONCE_BYTES = 32
CLOCK_PROBES = 5
_MAC_BYTES = hashlib.sha256().digest_size
_CLOCK = struct.Struct(">d")
_BOOT_ID_BYTES = 36


def _boot_id() -> bytes:
    """This host's boot id (Linux): equal ids share one monotonic clock."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return f.read().strip()[:_BOOT_ID_BYTES].ljust(_BOOT_ID_BYTES, b"-")
    except OSError:
        return os.urandom(_BOOT_ID_BYTES // 2).hex().encode()  # unknown: never "the same host"


_FRONT_END, _ENGINE = b"rtserve-front-end", b"rtserve-engine"


class HandshakeRefused(ConnectionError):
    """The peer did not prove the cluster secret (or went quiet while trying)."""


def _mac(secret: bytes, role: bytes, engine_nonce: bytes, front_nonce: bytes) -> bytes:
    return hmac.new(secret, role + engine_nonce + front_nonce, hashlib.sha256).digest()


async def _read(reader: asyncio.StreamReader, size: int) -> bytes:
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise HandshakeRefused("the peer closed the connection during the handshake") from None


async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: bytes, timeout_s: float) -> None:
    """Engine side: returns once the front-end proved the secret; raises ``HandshakeRefused``."""
    engine_nonce = os.urandom(NONCE_BYTES)
    writer.write(engine_nonce)

    async def exchange() -> None:
        front_nonce = await _read(reader, NONCE_BYTES)
        proof = await _read(reader, _MAC_BYTES)
        if not hmac.compare_digest(proof, _mac(secret, _FRONT_END, engine_nonce, front_nonce)):
            raise HandshakeRefused("the front-end did not prove the cluster secret")
        writer.write(_mac(secret, _ENGINE, engine_nonce, front_nonce) + _boot_id())
        for _ in range(CLOCK_PROBES):  # the front-end asks; each answer is our clock at once
            await _read(reader, 1)
            writer.write(_CLOCK.pack(time.monotonic()))

    try:
        await asyncio.wait_for(exchange(), timeout_s)
    except TimeoutError:
        raise HandshakeRefused("the front-end did not finish the handshake in time") from None


async def connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: bytes, timeout_s: float) -> float:
    """Front-end side: returns the engine's monotonic clock minus ours; raises
    ``HandshakeRefused`` when the engine does not prove the secret."""

    async def exchange() -> float:
        engine_nonce = await _read(reader, NONCE_BYTES)
        front_nonce = os.urandom(NONCE_BYTES)
        writer.write(front_nonce + _mac(secret, _FRONT_END, engine_nonce, front_nonce))
        proof = await _read(reader, _MAC_BYTES)
        if not hmac.compare_digest(proof, _mac(secret, _ENGINE, engine_nonce, front_nonce)):
            raise HandshakeRefused("the engine did not prove the cluster secret")
        same_host = await _read(reader, _BOOT_ID_BYTES) == _boot_id()
        probes = []
        for _ in range(CLOCK_PROBES):
            sent = time.monotonic()
            writer.write(b"?")
            (engine_clock,) = _CLOCK.unpack(await _read(reader, _CLOCK.size))
            received = time.monotonic()
            probes.append((received - sent, engine_clock - (sent + received) / 2))
        return 0.0 if same_host else min(probes)[1]

    try:
        return await asyncio.wait_for(exchange(), timeout_s)
    except TimeoutError:
        raise HandshakeRefused("the engine did not finish the handshake in time") from None


Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def authenticated(serve: Serve, secret: bytes, timeout_s: float) -> Serve:
    """A connection handler for ``asyncio.start_server`` that hands a connection to ``serve``
    (``EngineServer.serve_connection``) only once the peer proved the secret."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await accept(reader, writer, secret, timeout_s)
        except ConnectionError as exc:  # nothing this peer sent was unpickled
            log.warning("engine link refused %s: %s", writer.get_extra_info("peername"), exc)
            writer.close()
            return
        await serve(reader, writer)

    return handle
