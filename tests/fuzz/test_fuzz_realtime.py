"""Fuzzing the realtime and duplex JSON event parsers through their real sockets
(``/v1/realtime``, its beta dialect, ``/v1/realtime?duplex=1``, ``/v1/duplex``): events of
every known type with random fields and values, non-JSON text and binary frames. Every
answer is a typed ``error`` event or a clean close; the log stays clean; the canary session
opened before keeps echoing; RSS stays bounded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import websockets
from hypothesis import given
from hypothesis import strategies as st
from websockets.sync.client import connect

from rtserve.app import build_app
from tests.fuzz.fuzz_support import (
    FUZZ,
    WAIT_S,
    FuzzServer,
    b64,
    check_close_code,
    check_error,
    fuzz_config,
    fuzz_server,
)
from tests.fuzz.strategies import json_values

pytestmark = pytest.mark.timeout(240)

ROUTES = ["/v1/realtime", "/v1/realtime?api=beta", "/v1/realtime?duplex=1", "/v1/duplex"]
EVENT_TYPES = [
    "session.update",
    "session.create",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
    "output_audio_buffer.clear",
    "conversation.item.create",
    "conversation.item.truncate",
    "conversation.item.delete",
    "conversation.item.retrieve",
    "response.create",
    "response.cancel",
    "session.heartbeat",
    "session.event_ack",
    "session.close",
    "session.resume",
    "playback.ack",
    "overlap.decision",
    "turn.signal",
    "input.audio.append",
    "audio.playback_ack",
    "signal_turn",
    "transcription_session.update",
    "unknown.type",
]
SENTINEL = "fuzz-sentinel-7f3a"

formats = st.one_of(
    st.sampled_from(["pcm16", "g711_ulaw", "g711_alaw", "audio/pcm", "audio/pcmu", "opus"]),
    st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["audio/pcm", "audio/pcmu", "x"]) | json_values(),
            "rate": st.integers(-1, 200_000) | json_values(),
        },
    ),
    json_values(),
)
audio = st.one_of(st.binary(max_size=4000).map(b64), st.text(max_size=50), json_values())
sessions = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["realtime", "transcription"]) | json_values(),
        "instructions": st.text(max_size=50) | json_values(),
        "voice": st.text(max_size=20) | json_values(),
        "output_modalities": st.lists(st.sampled_from(["audio", "text", "x"]), max_size=3) | json_values(),
        "modalities": st.lists(st.sampled_from(["audio", "text"]), max_size=3) | json_values(),
        "temperature": st.floats(allow_nan=True) | json_values(),
        "max_output_tokens": st.integers(-5, 10**20) | st.just("inf") | json_values(),
        "max_response_output_tokens": st.integers(-5, 10**6) | json_values(),
        "turn_detection": st.none()
        | st.fixed_dictionaries(
            {"type": st.sampled_from(["server_vad", "semantic_vad", "x"])},
            optional={"threshold": json_values(), "silence_duration_ms": json_values()},
        ),
        "input_audio_format": formats,
        "output_audio_format": formats,
        "audio": st.fixed_dictionaries(
            {},
            optional={
                "input": st.fixed_dictionaries(
                    {},
                    optional={
                        "format": formats,
                        "turn_detection": json_values(),
                        "transcription": json_values(),
                        "noise_reduction": json_values(),
                    },
                ),
                "output": st.fixed_dictionaries(
                    {}, optional={"format": formats, "voice": json_values(), "speed": json_values()}
                ),
            },
        )
        | json_values(),
        "tools": json_values(),
        "tool_choice": json_values(),
        "include": json_values(),
    },
)
items = st.fixed_dictionaries(
    {},
    optional={
        "id": st.text(max_size=20) | json_values(),
        "type": st.sampled_from(["message", "function_call", "x"]) | json_values(),
        "role": st.sampled_from(["user", "assistant", "system", "tool"]) | json_values(),
        "content": st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["input_text", "text", "input_audio", "x"])},
                optional={"text": st.text(max_size=50) | json_values(), "audio": audio, "transcript": json_values()},
            ),
            max_size=3,
        )
        | json_values(),
    },
)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "event_id": st.text(max_size=20) | json_values(),
    "session": sessions | json_values(),
    "audio": audio,
    "item": items | json_values(),
    "item_id": st.text(max_size=20) | json_values(),
    "previous_item_id": st.text(max_size=20) | json_values(),
    "response": st.fixed_dictionaries(
        {},
        optional={
            "instructions": json_values(),
            "output_modalities": json_values(),
            "modalities": json_values(),
            "voice": json_values(),
            "temperature": json_values(),
            "max_output_tokens": json_values(),
            "metadata": json_values(),
            "conversation": st.sampled_from(["auto", "none"]) | json_values(),
            "input": json_values(),
            "audio": json_values(),
            "output_audio_format": formats,
        },
    )
    | json_values(),
    "response_id": st.text(max_size=20) | json_values(),
    "content_index": st.integers(-2, 5) | json_values(),
    "audio_end_ms": st.integers(-10, 10**12) | json_values(),
    "played_ms": st.integers(-10, 10**12) | json_values(),
    "committed_ms": json_values(),
    "truncate": json_values(),
    "server_event_seq": st.integers(-1, 10**12) | json_values(),
    "session_id": st.text(max_size=30) | json_values(),
    "resume_token": st.text(max_size=30) | json_values(),
    "attachment_generation": st.integers(-1, 3) | json_values(),
    "lease_generation": json_values(),
    "last_received_server_event_seq": json_values(),
    "format": formats,
    "input_audio_format": formats,
    "sample_rate_hz": st.integers(-1, 400_000) | json_values(),
    "is_speech": json_values(),
    "response_create": json_values(),
    "action": st.sampled_from(["barge_in", "listen", "drop"]) | json_values(),
    "overlap_ms": json_values(),
    "event": json_values(),
    "payload": json_values(),
}
events = st.fixed_dictionaries({"type": st.sampled_from(EVENT_TYPES) | json_values()}, optional=FIELDS)
# Well-formed events, each with at most one field replaced: reach past validation into the session.
_PCM = b64(bytes(960))
VALID_EVENTS: list[dict[str, Any]] = [
    {"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}},
    {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}},
    {"type": "input_audio_buffer.append", "audio": _PCM},
    {"type": "input_audio_buffer.append", "audio": _PCM, "format": {"type": "audio/pcmu"}, "sample_rate_hz": 8000},
    {"type": "input_audio_buffer.commit"},
    {"type": "input_audio_buffer.clear"},
    {"type": "output_audio_buffer.clear"},
    {
        "type": "conversation.item.create",
        "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]},
    },
    {
        "type": "conversation.item.create",
        "item": {
            "id": "it1",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "hi"}],
        },
    },
    {"type": "conversation.item.truncate", "item_id": "it1", "content_index": 0, "audio_end_ms": 40},
    {"type": "conversation.item.delete", "item_id": "it1"},
    {"type": "conversation.item.retrieve", "item_id": "it1"},
    {"type": "response.create", "response": {"output_modalities": ["text"], "max_output_tokens": 8}},
    {"type": "response.create"},
    {"type": "response.cancel"},
    {"type": "session.heartbeat"},
    {"type": "session.event_ack", "server_event_seq": 3},
    {"type": "playback.ack", "response_id": "r1", "played_ms": 80},
    {"type": "overlap.decision", "action": "listen"},
    {"type": "turn.signal", "event": "barge_in"},
    {"type": "session.resume", "session_id": "s1", "resume_token": "t", "attachment_generation": 0},
    {"type": "session.close"},
]


def _replace(args: tuple[dict[str, Any], tuple[str, Any] | None]) -> dict[str, Any]:
    event, change = args
    return {**event, change[0]: change[1]} if change else event


near_valid = st.tuples(
    st.sampled_from(VALID_EVENTS), st.none() | st.tuples(st.sampled_from(sorted(FIELDS)), json_values())
).map(_replace)
frames = st.one_of(
    near_valid.map(json.dumps),
    near_valid.map(json.dumps),
    events.map(lambda e: json.dumps(e)),
    json_values().map(json.dumps),
    st.text(max_size=200),
    st.binary(max_size=200),
)


@pytest.fixture(scope="module")
def server() -> Iterator[FuzzServer]:
    async def make_app():
        return build_app(fuzz_config())

    with fuzz_server(make_app) as running:
        yield running


def exchange(server: FuzzServer, route: str, messages: list[str | bytes]) -> None:
    """Send ``messages``, then a sentinel event; read until its error or the server's close."""
    with connect(server.ws_base + route, open_timeout=WAIT_S, close_timeout=WAIT_S, max_size=None) as ws:
        try:
            for message in messages:
                ws.send(message)
            ws.send(json.dumps({"type": "fuzz.sentinel", "event_id": SENTINEL}))
            for _ in range(20_000):
                event = json.loads(ws.recv(timeout=WAIT_S))
                assert isinstance(event, dict) and isinstance(event.get("type"), str), event
                if event["type"] == "error":
                    error = event["error"]
                    check_error(error.get("code"), error.get("message"))
                    if error.get("event_id") == SENTINEL:
                        break
            else:
                raise AssertionError("the sentinel was never answered")
        except websockets.ConnectionClosed as closed:
            check_close_code(closed.rcvd.code if closed.rcvd else None)
    server.assert_clean_log()


@pytest.mark.parametrize("route", ROUTES)
def test_event_streams_get_typed_errors_or_a_clean_close(server: FuzzServer, route: str) -> None:
    @FUZZ
    @given(st.lists(frames, min_size=1, max_size=6))
    def fuzz(messages: list[str | bytes]) -> None:
        exchange(server, route, messages)

    fuzz()


def test_zz_afterwards_the_canary_works_the_log_is_clean_and_rss_bounded(server: FuzzServer) -> None:
    server.assert_healthy_after_fuzzing()
