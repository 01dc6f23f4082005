"""Wire renderings of session events: OpenAI Realtime (GA and beta) and native duplex."""

from __future__ import annotations

import base64
import inspect
import json
import typing
from typing import Any

import numpy as np
import pydantic
import pytest
from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent
from openai.types.realtime import RealtimeServerEvent as GAServerEvent

from rtserve.codecs import g711
from rtserve.engines.events import OutputText
from rtserve.sessions import SessionConfig, TurnDetection
from rtserve.sessions import commands as cmd
from rtserve.sessions import events as ev
from rtserve.sessions.projections import NativeDuplexProjection, RealtimeProjection, compact_json, with_seq
from rtserve.sessions.projections.native import NATIVE_NAMES
from rtserve.sessions.projections.realtime import _GA_NAMES, Naming
from rtserve.sessions.session_config import AudioFormat
from tests.sessions.conftest import engine_session, settle, take_ready

SID = "duplex-abc"
EVENT_TYPES = [
    cls
    for _, cls in inspect.getmembers(ev, inspect.isclass)
    if issubclass(cls, ev.SessionEvent) and cls not in (ev.SessionEvent, ev.ResponsePartEvent)
]


def sdk_models(union: object) -> dict[str, type[pydantic.BaseModel]]:
    """The official SDK's server-event models by their ``type`` literal."""
    members = typing.get_args(union)
    if typing.get_origin(union) is typing.Annotated:
        members = typing.get_args(members[0])
    out = {}
    for model in members:
        for literal in typing.get_args(model.model_fields["type"].annotation):
            out[literal] = model
    return out


GA_MODELS, BETA_MODELS = sdk_models(GAServerEvent), sdk_models(BetaServerEvent)
DUPLEX_ONLY = {
    "session.heartbeat_ack",
    "session.closed",
    "session.expired",
    "session.resumed",
    "session.replaced",
    "session.resync_required",
    "overlap.decision",
    "playback.acknowledged",
}


def test_every_event_type_has_a_name_in_every_dialect() -> None:
    assert set(EVENT_TYPES) == set(_GA_NAMES) == set(NATIVE_NAMES)


@pytest.mark.parametrize(
    ("naming", "expected"),
    [
        (
            "ga",
            [
                "response.output_audio.delta",
                "response.output_audio_transcript.delta",
                "response.output_text.delta",
                "conversation.item.added",
            ],
        ),
        (
            "beta",
            [
                "response.audio.delta",
                "response.audio_transcript.delta",
                "response.text.delta",
                "conversation.item.created",
            ],
        ),
    ],
)
def test_ga_and_beta_names(naming: Naming, expected: list[str]) -> None:
    projection = RealtimeProjection(naming)
    ids: dict[str, Any] = {"session_id": SID, "response_id": "r", "item_id": "i"}
    events = [
        ev.AudioDelta(**ids, pcm=np.zeros(4, np.float32), sample_rate=24000),
        ev.TranscriptDelta(**ids, delta="a"),
        ev.TextDelta(**ids, delta="b"),
        ev.ItemAdded(session_id=SID, item=ev.ItemSnapshot("i", "user", "text", "hi")),
    ]
    assert [projection.render(e)["type"] for e in events] == expected


async def test_a_real_conversation_renders_to_valid_openai_sdk_events(engine, make_manager) -> None:
    """Every event of a scripted conversation validates against the official SDK models."""
    manager = make_manager(engine)
    handle = await manager.open(SessionConfig(model="gpt-realtime", turn_detection=TurnDetection()))
    session = engine_session(engine, handle)
    handle.submit(cmd.AppendAudio(audio=np.zeros(2400, np.float32)))
    handle.submit(cmd.Commit(response_create=True))
    await settle()
    response_id = session.responses[0].response_id
    session.audio(response_id, text="Hi")
    session.finish(response_id)
    await settle()
    handle.submit(cmd.ConversationItemCreate(role="user", text="And?"))
    handle.submit(cmd.ResponseCreate(modalities=("text",)))
    handle.submit(cmd.ConversationItemTruncate(item_id=f"item_{response_id}", audio_end_ms=0))
    handle.submit(cmd.ConversationItemDelete(item_id=f"item_{response_id}"))
    handle.submit(cmd.Clear(target="input"))
    handle.submit(cmd.Commit(event_id="empty"))  # an error
    await settle()
    session.emit(OutputText("ok", handle.epoch, session.responses[1].response_id))
    session.finish(session.responses[1].response_id)
    handle.submit(cmd.ResponseCancel(event_id="none-active"))
    events = await take_ready(handle.attachment)
    assert len(events) > 25
    dialects: tuple[tuple[Naming, dict[str, type[pydantic.BaseModel]]], ...] = (
        ("ga", GA_MODELS),
        ("beta", BETA_MODELS),
    )
    for naming, models in dialects:
        projection = RealtimeProjection(naming)
        checked = set()
        for event in events:
            wire = json.loads(projection.render_text(event))
            model = models.get(wire["type"])
            if model is None:
                assert wire["type"] in DUPLEX_ONLY | {"conversation.item.done"}, wire["type"]
                continue
            model.model_validate(wire)
            checked.add(wire["type"])
        assert {
            "session.created",
            "response.created",
            "response.done",
            "error",
            "input_audio_buffer.committed",
            "conversation.item.truncated",
            "conversation.item.deleted",
            "rate_limits.updated",
        } <= checked


def test_duplex_extensions_add_the_epoch_and_the_history_flag() -> None:
    done = ev.ResponseDone(
        session_id=SID,
        epoch=3,
        response_id="r",
        status="failed",
        committed=False,
        status_details={"type": "failed", "reason": "output_backpressure"},
    )
    plain = RealtimeProjection("ga").render(done)
    duplex = RealtimeProjection("ga", duplex=True).render(done)
    assert "epoch" not in plain and plain["response"]["metadata"] is None
    assert duplex["epoch"] == 3
    assert duplex["response"]["metadata"] == {"committed": False}
    assert duplex["response"]["status_details"] == {"type": "failed", "reason": "output_backpressure"}
    # OpenAI's clients validate a failure's reason as its error (status_details.reason is a closed set).
    assert plain["response"]["status_details"] == {"type": "failed", "error": {"code": "output_backpressure"}}


@pytest.mark.parametrize("audio_format", ["pcm16", "pcm_f32le", "g711_ulaw", "g711_alaw"])
def test_audio_deltas_carry_the_session_format(audio_format: AudioFormat) -> None:
    pcm = np.linspace(-0.9, 0.9, 160, dtype=np.float32)
    rate = 8000 if audio_format.startswith("g711") else 24000
    delta = ev.AudioDelta(
        session_id=SID, response_id="r", item_id="i", pcm=pcm, sample_rate=rate, audio_format=audio_format
    )
    wire = RealtimeProjection("ga").render(delta)
    raw = base64.b64decode(wire["delta"])
    assert wire["sample_rate_hz"] == rate
    if audio_format == "pcm16":
        decoded = np.frombuffer(raw, "<i2").astype(np.float32) / 32768
        np.testing.assert_allclose(decoded, pcm, atol=1 / 32768)
    elif audio_format == "pcm_f32le":
        np.testing.assert_array_equal(np.frombuffer(raw, "<f4"), pcm)
    else:
        law: g711.G711Law = "ulaw" if audio_format == "g711_ulaw" else "alaw"
        np.testing.assert_allclose(g711.decode(law, raw), pcm, atol=0.03)


def test_session_objects_follow_each_dialect() -> None:
    config = SessionConfig(voice="alloy", output_audio_format="g711_ulaw", turn_detection=TurnDetection())
    snapshot = ev.SessionSnapshot(
        id=SID,
        config=config,
        capabilities={"engine": "x", "supports_barge_in": True},
        epoch=2,
        turn_id=1,
        resumable=True,
    )
    created = ev.SessionCreated(session_id=SID, session=snapshot, resume_token="tok")
    ga = RealtimeProjection("ga").render(created)["session"]
    beta = RealtimeProjection("beta").render(created)["session"]
    assert ga["audio"]["output"] == {"format": {"type": "audio/pcmu"}, "voice": "alloy", "speed": 1.0}
    assert ga["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert beta["output_audio_format"] == "g711_ulaw" and beta["voice"] == "alloy"
    for session in (ga, beta):
        assert session["id"] == SID and session["epoch"] == 2 and session["turn_id"] == 1
        assert session["capabilities"]["supports_session_resume"] is True


def test_native_dialect_is_flat_and_names_its_session_and_epoch() -> None:
    projection = NativeDuplexProjection()
    pcm = np.full(4, 0.5, np.float32)
    ids: dict[str, Any] = {"session_id": SID, "epoch": 1, "response_id": "r", "item_id": "i"}
    audio = projection.render(ev.AudioDelta(**ids, pcm=pcm, sample_rate=24000))
    assert audio["type"] == "response.output_audio.delta"
    assert (audio["session_id"], audio["epoch"], audio["format"], audio["sample_rate_hz"]) == (SID, 1, "pcm16", 24000)
    assert base64.b64decode(audio["audio"]) == (np.full(4, 16384, "<i2")).tobytes()
    done = projection.render(
        ev.ResponseDone(
            session_id=SID,
            response_id="r",
            status="cancelled",
            committed=True,
            output=(ev.ItemSnapshot("i", "assistant", "audio", "hey"),),
        )
    )
    assert (done["type"], done["status"], done["committed"]) == ("response.done", "cancelled", True)
    assert done["output"] == [{"id": "i", "role": "assistant", "kind": "audio", "text": "hey", "status": "completed"}]
    error = projection.render(ev.ErrorEvent(session_id=SID, code="unknown_session", message="m", related_event_id="e1"))
    assert error["error"]["code"] == "unknown_session" and error["error"]["event_id"] == "e1"
    for cls in (ev.InputCommitted, ev.OutputAudioCleared, ev.SessionClosed):
        assert NATIVE_NAMES[cls] in {"input.committed", "audio.cancelled", "session.closed"}


def test_sequence_numbers_are_spliced_into_valid_json() -> None:
    text = RealtimeProjection("ga").render_text(ev.HeartbeatAck(session_id=SID))
    stamped = json.loads(with_seq(text, 42))
    assert stamped["server_event_seq"] == 42 and stamped["type"] == "session.heartbeat_ack"


@pytest.mark.parametrize(
    "projection", [RealtimeProjection("ga", duplex=True), RealtimeProjection("beta"), NativeDuplexProjection()]
)
def test_spliced_audio_text_is_byte_identical_to_plain_compact_json(projection) -> None:
    delta = ev.AudioDelta(
        session_id=SID,
        epoch=2,
        response_id="r",
        item_id='i"tem',
        sample_rate=24000,
        pcm=np.random.default_rng(3).uniform(-1, 1, 1920).astype(np.float32),
    )
    assert projection.render_text(delta) == compact_json(projection.render(delta))
