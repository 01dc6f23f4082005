"""Fuzzing the Moshi routes through their real sockets: ``/api/chat`` query parameters,
tagged binary frames and Ogg pages (random, and sphn's valid stream mutated), and
``/v1/audio/duplex`` JSON control and raw float32 PCM. Every answer is a typed error or a
clean close; the log stays clean; the canary session keeps echoing; RSS stays bounded."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator

import numpy as np
import pytest
import sphn
import websockets
from hypothesis import given
from hypothesis import strategies as st
from websockets.sync.client import ClientConnection, connect

from rtserve.app import build_app
from tests.fuzz.fuzz_support import (
    FUZZ,
    WAIT_S,
    FuzzServer,
    check_close_code,
    check_error,
    fuzz_config,
    fuzz_server,
    speech_pcm,
)
from tests.fuzz.strategies import json_values, mutated

pytestmark = pytest.mark.timeout(240)

_writer = sphn.OpusStreamWriter(24_000)
VALID_OGG = b"".join(_writer.append_pcm(speech_pcm(1920 * 3)[i : i + 1920]) for i in range(0, 1920 * 3, 1920))
SENTINEL = "fuzz-sentinel-7f3a"

query = st.dictionaries(
    st.sampled_from(
        ["text_prompt", "voice_prompt", "seed", "text_temperature", "text_topk", "audio_temperature", "audio_topk", "x"]
    ),
    st.one_of(
        st.text(max_size=30),
        st.integers(-(2**70), 2**70).map(str),
        st.floats().map(str),
        st.sampled_from(["../../etc/passwd", "NATF0.pt", "nan", "inf", "-1"]),
    ),
    max_size=4,
)
chat_frames = st.one_of(
    mutated(VALID_OGG).map(lambda pages: b"\x01" + pages),
    st.binary(max_size=300).map(lambda data: b"\x01" + data),
    st.tuples(st.integers(0, 255), st.binary(max_size=100)).map(lambda t: bytes((t[0],)) + t[1]),
    st.text(max_size=50),
)
open_messages = st.fixed_dictionaries(
    {"type": st.just("open")},
    optional={
        "persona": st.text(max_size=40) | json_values(),
        "voice": st.text(max_size=30) | json_values(),
        "seed": st.integers(-(2**70), 2**70) | json_values(),
    },
)
duplex_frames = st.one_of(
    open_messages.map(json.dumps),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["open", "close", "x"]) | json_values()},
        optional={"persona": json_values(), "voice": json_values(), "seed": json_values()},
    ).map(json.dumps),
    json_values().map(json.dumps),
    st.text(max_size=60),
    st.binary(max_size=400),
    st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), max_size=200).map(
        lambda xs: np.asarray(xs, dtype="<f4").tobytes()
    ),
)


@pytest.fixture(scope="module")
def server() -> Iterator[FuzzServer]:
    async def make_app():
        return build_app(fuzz_config())

    with fuzz_server(make_app) as running:
        yield running


def _received_close(ws: ClientConnection) -> int | None:
    rcvd = ws.protocol.close_rcvd
    return rcvd.code if rcvd is not None else None


def chat_exchange(server: FuzzServer, params: dict[str, str], messages: list[bytes | str]) -> None:
    url = server.ws_base + "/api/chat" + ("?" + urllib.parse.urlencode(params) if params else "")
    with connect(url, open_timeout=WAIT_S, close_timeout=WAIT_S, max_size=None) as ws:
        try:
            first = ws.recv(timeout=WAIT_S)
            assert first == b"\x00", first[:20]
            for message in messages:
                ws.send(message)
            ws.close()
        except websockets.ConnectionClosed:
            pass
        for _ in range(10_000):  # drain what was in flight; the close is what matters
            try:
                ws.recv(timeout=WAIT_S)
            except websockets.ConnectionClosed:
                break
        code = _received_close(ws)
        check_close_code(code)
        if ws.protocol.close_rcvd is not None:
            check_error("close", ws.protocol.close_rcvd.reason)  # a reason a client may read: no internals
    server.assert_clean_log()


def duplex_exchange(server: FuzzServer, messages: list[bytes | str]) -> None:
    with connect(server.ws_base + "/v1/audio/duplex", open_timeout=WAIT_S, close_timeout=WAIT_S, max_size=None) as ws:
        try:
            for message in messages:
                ws.send(message)
            ws.send(json.dumps({"type": SENTINEL}))
            for _ in range(20_000):
                received = ws.recv(timeout=WAIT_S)
                if isinstance(received, bytes):
                    continue
                event = json.loads(received)
                assert isinstance(event, dict) and event.get("type") in ("ready", "text", "error", "done"), event
                if event["type"] == "error":
                    check_error(event.get("code"), event.get("error"))
                    if SENTINEL in event["error"]:
                        break
            else:
                raise AssertionError("the sentinel was never answered")
        except websockets.ConnectionClosed:
            check_close_code(_received_close(ws))
    server.assert_clean_log()


@FUZZ
@given(query, st.lists(chat_frames, max_size=5))
def test_chat_frames_and_ogg_pages_close_cleanly(
    server: FuzzServer, params: dict[str, str], messages: list[bytes | str]
) -> None:
    chat_exchange(server, params, messages)


@FUZZ
@given(st.lists(duplex_frames, min_size=1, max_size=6))
def test_duplex_control_and_pcm_get_typed_errors(server: FuzzServer, messages: list[bytes | str]) -> None:
    duplex_exchange(server, messages)


def test_zz_afterwards_the_canary_works_the_log_is_clean_and_rss_bounded(server: FuzzServer) -> None:
    server.assert_healthy_after_fuzzing()
