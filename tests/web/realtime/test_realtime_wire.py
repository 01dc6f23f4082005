"""Client-event parsing of the realtime routes and the input audio decoder (unit level)."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtserve.codecs import g711
from rtserve.codecs.errors import CodecError, InvalidBase64Error
from rtserve.config import SessionLimits
from rtserve.sessions import SessionConfig
from rtserve.sessions import commands as cmd
from rtserve.web.realtime.audio import InputAudioDecoder
from rtserve.web.realtime.client_events import (
    AppendInput,
    ClearInput,
    CommitInput,
    EventRules,
    ResumeSession,
    UpdateSession,
    parse_client_event,
)
from rtserve.web.realtime.errors import WireError
from rtserve.web.realtime.session_object import session_changes

TURNS = EventRules(duplex=False, supports_server_vad=True)
DUPLEX = EventRules(duplex=True, supports_server_vad=False)


def parse(event: dict, rules: EventRules = TURNS):
    return parse_client_event(json.dumps(event), rules)


def test_ga_beta_and_native_session_objects_map_to_the_same_config() -> None:
    ga = session_changes(
        {
            "type": "realtime",
            "instructions": "hi",
            "output_modalities": ["text"],
            "max_output_tokens": 50,
            "tools": [],
            "tracing": "auto",
            "audio": {
                "input": {"format": {"type": "audio/pcmu"}, "turn_detection": None, "noise_reduction": None},
                "output": {"format": {"type": "audio/pcma"}, "voice": "joe"},
            },
        },
        supports_server_vad=True,
    )
    beta = session_changes(
        {
            "instructions": "hi",
            "modalities": ["text"],
            "max_response_output_tokens": 50,
            "input_audio_format": "g711_ulaw",
            "output_audio_format": "g711_alaw",
            "voice": "joe",
            "turn_detection": None,
        },
        supports_server_vad=True,
    )
    native = session_changes(
        {
            "instructions": "hi",
            "modalities": ["text"],
            "max_output_tokens": 50,
            "input_audio_format": "g711_ulaw",
            "output_audio_format": "g711_alaw",
            "voice": "joe",
            "turn_detection": None,
        },
        supports_server_vad=True,
    )
    assert ga.pop("tools") == ()  # GA clients send their (here: no) function tools
    assert ga == beta == native
    config = SessionConfig().updated(ga, SessionLimits())
    assert (config.input_audio_format, config.output_audio_format, config.output_sample_rate) == (
        "g711_ulaw",
        "g711_alaw",
        8000,
    )
    assert config.turn_detection is None and config.modalities == ("text",) and config.max_output_tokens == 50


def test_only_named_fields_change_and_turn_detection_null_is_kept_apart_from_absent() -> None:
    assert session_changes({}, supports_server_vad=True) == {}
    assert session_changes({"turn_detection": None}, supports_server_vad=True) == {"turn_detection": None}
    vad = session_changes(
        {
            "audio": {
                "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 200, "idle_timeout_ms": 5000}}
            }
        },
        supports_server_vad=True,
    )["turn_detection"]
    assert vad["silence_duration_ms"] == 200 and vad["threshold"] == 0.5


@pytest.mark.parametrize(
    "session,code,param",
    [
        ({"audio": {"output": {"format": "mp3"}}}, "invalid_value", "session.audio.output.format"),
        (
            {"audio": {"input": {"format": {"type": "audio/pcmu", "rate": 16000}}}},
            "invalid_value",
            "session.audio.input.format.rate",
        ),
        (
            {"turn_detection": {"type": "server_vad", "threshold": 3}},
            "invalid_value",
            "session.turn_detection.threshold",
        ),
        ({"modalities": ["video"]}, "invalid_event", "session.modalities.0"),
        ({"instructions": 5}, "invalid_event", "session.instructions"),
    ],
)
def test_bad_session_values_name_the_field(session: dict, code: str, param: str) -> None:
    with pytest.raises(WireError) as caught:
        parse({"type": "session.update", "session": session, "event_id": "e7"})
    assert (caught.value.code, caught.value.param, caught.value.event_id) == (code, param, "e7")


def test_server_vad_is_refused_when_the_engine_has_none() -> None:
    with pytest.raises(WireError) as caught:
        parse({"type": "session.update", "session": {"turn_detection": {"type": "server_vad"}}}, DUPLEX)
    assert caught.value.code == "unsupported_turn_detection"


def test_client_events_become_commands() -> None:
    assert parse({"type": "input_audio_buffer.append", "audio": "AAA="}) == AppendInput("AAA=")
    assert parse({"type": "input_audio_buffer.commit", "event_id": "c"}) == CommitInput(False, "c")
    assert parse({"type": "input_audio_buffer.clear"}) == ClearInput()
    assert isinstance(parse({"type": "session.update", "session": {}}), UpdateSession)
    created = parse(
        {
            "type": "conversation.item.create",
            "previous_item_id": "root",
            "item": {
                "id": "i1",
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "hello"}],
            },
        }
    )
    assert isinstance(created, cmd.ConversationItemCreate)
    assert (created.item_id, created.role, created.text, created.previous_item_id) == ("i1", "user", "hello", "root")
    truncate = parse({"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": 640})
    assert isinstance(truncate, cmd.ConversationItemTruncate) and truncate.audio_end_ms == 640
    response = parse(
        {
            "type": "response.create",
            "response": {
                "output_modalities": ["text"],
                "instructions": "x",
                "max_output_tokens": "inf",
                "audio": {"output": {"voice": "joe"}},
            },
        }
    )
    assert isinstance(response, cmd.ResponseCreate)
    assert (response.modalities, response.instructions, response.voice, response.max_output_tokens) == (
        ("text",),
        "x",
        "joe",
        None,
    )
    cancel = parse({"type": "response.cancel", "response_id": "r"})
    assert isinstance(cancel, cmd.ResponseCancel) and cancel.response_id == "r"
    assert isinstance(parse({"type": "output_audio_buffer.clear"}), cmd.Clear)


def test_duplex_extensions_only_on_duplex_connections() -> None:
    with pytest.raises(WireError) as caught:
        parse({"type": "playback.ack", "response_id": "r", "played_ms": 5})
    assert caught.value.code == "invalid_event"
    ack = parse({"type": "audio.playback_ack", "response_id": "r", "played_ms": 5, "truncate": True}, DUPLEX)
    assert isinstance(ack, cmd.PlaybackAck) and ack.truncate
    resume = parse(
        {
            "type": "session.resume",
            "session_id": "s",
            "resume_token": "t",
            "lease_generation": 2,
            "last_received_server_event_seq": 9,
            "event_id": "r1",
        },
        DUPLEX,
    )
    assert resume == ResumeSession("s", "t", 2, 9, "r1")
    append = parse(
        {
            "type": "input_audio_buffer.append",
            "audio": "",
            "format": "pcm_f32le",
            "sample_rate_hz": 16000,
            "is_speech": False,
        },
        DUPLEX,
    )
    assert append == AppendInput("", "pcm_f32le", 16000, False)
    assert isinstance(parse({"type": "close"}, DUPLEX), cmd.Close)


def test_unsupported_response_shapes_are_refused() -> None:
    for response, param in (
        ({"conversation": "conv_123"}, "response.conversation"),
        (
            {"input": [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "response.input.0.content",
        ),
        ({"audio": {"output": {"format": {"type": "audio/pcmu"}}}}, "response.audio.output.format"),
    ):
        with pytest.raises(WireError) as caught:
            parse({"type": "response.create", "response": response})
        assert (caught.value.code, caught.value.param) == ("invalid_value", param)


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.text(max_size=200),
        st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=20),
            lambda inner: (
                st.lists(inner, max_size=4)
                | st.dictionaries(
                    st.sampled_from(["type", "audio", "session", "item", "event_id", "response", "format", "x"]),
                    inner,
                    max_size=5,
                )
            ),
            max_leaves=20,
        ).map(json.dumps),
    )
)
def test_any_frame_parses_or_raises_wire_error(text: str) -> None:
    for rules in (TURNS, DUPLEX):
        try:
            parse_client_event(text, rules)
        except WireError as exc:
            assert exc.code and exc.message and exc.error_type == "invalid_request_error"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_pcm16_at_the_engine_rate_passes_through_bit_exact() -> None:
    decoder = InputAudioDecoder(24000)
    samples = np.arange(-500, 500, dtype="<i2")
    out = decoder.decode(b64(samples.tobytes()), "pcm16")
    np.testing.assert_array_equal(np.rint(out * 32768).astype(np.int16), samples)
    assert decoder.flush().size == 0


def test_g711_is_decoded_and_resampled_to_the_engine_rate_without_losing_length() -> None:
    decoder = InputAudioDecoder(16000)
    tone = (0.5 * np.sin(2 * np.pi * 300 * np.arange(8000) / 8000)).astype(np.float32)
    pieces = [decoder.decode(b64(g711.encode("alaw", tone[i : i + 160])), "g711_alaw") for i in range(0, 8000, 160)]
    out = np.concatenate([*pieces, decoder.flush()])
    assert abs(len(out) - 16000) <= 2  # the held-back tail comes out at flush
    assert abs(np.sqrt(np.mean(out[1000:15000] ** 2)) - 0.5 / np.sqrt(2)) < 0.02


def test_a_rate_change_mid_stream_starts_a_fresh_resampler() -> None:
    decoder = InputAudioDecoder(24000)
    first = decoder.decode(b64(np.zeros(1600, "<f4").tobytes()), "pcm_f32le", 16000)
    second = decoder.decode(b64(np.zeros(2400, "<i2").tobytes()), "pcm16", 24000)
    assert len(first) + len(second) == 2400 + 2400  # the 16 kHz tail was flushed into the switch


def test_bad_audio_raises_typed_codec_errors() -> None:
    decoder = InputAudioDecoder(24000)
    with pytest.raises(InvalidBase64Error):
        decoder.decode("not-valid-base64!!!", "pcm16")
    with pytest.raises(CodecError):
        decoder.decode(b64(b"\x00\x01\x02"), "pcm16")  # half a sample
    with pytest.raises(CodecError):
        decoder.decode(b64(np.array([np.nan], "<f4").tobytes()), "pcm_f32le")
    with pytest.raises(CodecError):
        decoder.decode(b64(b"\x00"), "g711_ulaw", 16000)
