"""The per-session runner: responses, epochs, barge-in, VAD turns, transcripts
(docs/sessions.md#runner, docs/sessions.md#command-dispatch)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from rtserve.engines.errors import EngineError
from rtserve.engines.events import EngineFailure, OutputText, SpeechStarted, SpeechStopped
from rtserve.sessions import SessionConfig, TurnDetection
from rtserve.sessions import commands as cmd
from rtserve.sessions import events as ev
from tests.sessions.conftest import buffer_of, engine_session, names, of_type, read_to_end, settle, take_ready
from tests.sessions.engine_double import TestDoubleEngine

SPEECH = np.full(2400, 0.1, dtype=np.float32)  # 100 ms at 24 kHz


async def open_session(make_manager, engine, config: SessionConfig | None = None, **limits):
    manager = make_manager(engine, **limits)
    handle = await manager.open(config)
    await take_ready(handle.attachment)  # SessionCreated
    return manager, handle, engine_session(engine, handle)


async def start_response(handle, session) -> str:
    handle.submit(cmd.ResponseCreate())
    await settle()
    return session.responses[-1].response_id


async def test_a_response_streams_audio_with_transcripts_then_one_completion_batch(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine)
    response_id = await start_response(handle, session)
    session.audio(response_id, text="Hel")
    session.audio(response_id, text="lo")
    session.finish(response_id)
    events = await take_ready(handle.attachment)
    assert names(events) == [
        "ResponseCreated",
        "ItemAdded",
        "OutputItemAdded",
        "ContentPartAdded",
        "AudioDelta",
        "TranscriptDelta",
        "AudioDelta",
        "TranscriptDelta",
        "AudioDone",
        "TranscriptDone",
        "ContentPartDone",
        "OutputItemDone",
        "ItemDone",
        "ResponseDone",
        "RateLimitsUpdated",
    ]
    assert all(e.session_id == handle.session_id and e.epoch == 0 for e in events)
    seqs = [seq for e in events if (seq := e.server_event_seq) is not None]
    assert len(seqs) == len(events) and seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    done = of_type(events, ev.ResponseDone)[0]
    assert (done.response_id, done.status, done.committed) == (response_id, "completed", True)
    assert of_type(events, ev.TranscriptDone)[0].transcript == "Hello"
    assert handle.history[-1].content == "Hello"
    assert handle.active_response_id is None


async def test_only_one_response_is_active_at_a_time(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine)
    first = await start_response(handle, session)
    handle.submit(cmd.ResponseCreate(event_id="second"))
    events = await take_ready(handle.attachment)
    [error] = of_type(events, ev.ErrorEvent)
    assert (error.code, error.related_event_id) == ("conversation_already_has_active_response", "second")
    assert len(session.responses) == 1 and handle.active_response_id == first


async def test_cancel_advances_the_epoch_drops_queued_audio_and_ends_the_response(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine)
    response_id = await start_response(handle, session)
    session.audio(response_id, text="a")
    await settle()
    handle.submit(cmd.ResponseCancel(event_id="cancel"))
    session.audio(response_id, text="late", epoch=0)  # in flight when the fence moved
    session.finish(response_id, epoch=0)
    events = await take_ready(handle.attachment)
    assert session.epochs == [1] and handle.epoch == 1
    assert of_type(events, ev.AudioDelta) == []  # the queued audio of epoch 0 was dropped
    dones = of_type(events, ev.ResponseDone)
    assert len(dones) == 1 and dones[0].status == "cancelled"
    assert dones[0].status_details == {"type": "cancelled", "reason": "client_cancelled"}
    assert dones[0].epoch == 1
    assert of_type(events, ev.OutputAudioCleared)[0].response_id == response_id


async def test_cancel_without_an_active_response_is_an_error(engine, make_manager) -> None:
    _, handle, _session = await open_session(make_manager, engine)
    handle.submit(cmd.ResponseCancel(event_id="c"))
    [error] = await take_ready(handle.attachment)
    assert isinstance(error, ev.ErrorEvent)
    assert error.code == "response_cancel_not_active" and error.related_event_id == "c"
    assert handle.epoch == 0


async def test_stale_epoch_output_is_dropped_after_barge_in(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine)
    response_id = await start_response(handle, session)
    handle.submit(cmd.BargeIn())
    await settle()
    session.audio(response_id, epoch=0)
    session.audio(response_id, epoch=1)  # right epoch, but the response is over
    await settle()
    events = await take_ready(handle.attachment)
    assert of_type(events, ev.AudioDelta) == []
    assert (of_type(events, ev.ResponseDone)[0].status_details or {}).get("reason") == "barge_in"
    assert handle._runner.metrics.stale_outputs._value.get() == 2


async def test_barge_in_drops_active_and_draining_audio_before_the_engine_is_fenced(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine)
    buffer = buffer_of(handle)
    draining = await start_response(handle, session)
    session.audio(draining, text="x")
    session.audio(draining, text="y")
    session.finish(draining)  # done, but its audio is still queued for the client
    await settle()
    active = await start_response(handle, session)
    session.audio(active, text="z")
    await settle()
    held = await handle.attachment.next_delivery()  # the consumer holds one event
    while not isinstance(held.event, ev.AudioDelta):
        held = await handle.attachment.next_delivery()
    assert held.event.response_id == draining

    seen_at_fence: list[tuple[int, bool]] = []
    session.on_set_epoch.append(
        lambda: seen_at_fence.append(
            (sum(isinstance(e.event, ev.AudioDelta) for e in buffer._queue), buffer.is_valid(held.event))
        )
    )
    handle.submit(cmd.BargeIn())
    await settle()
    assert seen_at_fence == [(0, False)]  # nothing audible survived when the engine was told
    rest = await take_ready(handle.attachment)
    assert of_type(rest, ev.AudioDelta) == []
    cleared = {e.response_id for e in of_type(rest, ev.OutputAudioCleared)}
    assert cleared == {draining, active}
    assert [d.response_id for d in of_type(rest, ev.ResponseDone)] == [draining, active]  # one each


async def test_barge_in_is_refused_when_the_engine_cannot_interrupt(make_manager) -> None:
    engine = TestDoubleEngine(supports_barge_in=False)
    _, handle, session = await open_session(make_manager, engine)
    response_id = await start_response(handle, session)
    handle.submit(cmd.BargeIn(event_id="b"))
    [error] = of_type(await take_ready(handle.attachment), ev.ErrorEvent)
    assert error.code == "barge_in_unsupported"
    assert handle.active_response_id == response_id and handle.epoch == 0


async def test_close_invalidates_draining_audio_before_engine_cleanup(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine)
    buffer = buffer_of(handle)
    response_id = await start_response(handle, session)
    for _ in range(3):
        session.audio(response_id)
    await settle()
    held = None
    while held is None or not isinstance(held.event, ev.AudioDelta):
        held = await handle.attachment.next_delivery()
    seen_at_close: list[tuple[int, bool]] = []
    session.on_close.append(
        lambda: seen_at_close.append(
            (sum(isinstance(e.event, ev.AudioDelta) for e in buffer._queue), buffer.is_valid(held.event))
        )
    )
    await handle.close()
    assert seen_at_close == [(0, False)]
    rest = await read_to_end(handle.attachment)
    assert of_type(rest, ev.OutputAudioCleared) == []  # close suppresses audio-cleared notices
    assert of_type(rest, ev.ResponseDone)[0].status == "cancelled"
    assert isinstance(rest[-1], ev.SessionClosed)


async def test_commit_of_an_empty_input_buffer_is_refused(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine)
    handle.submit(cmd.Commit(event_id="c1"))
    [error] = await take_ready(handle.attachment)
    assert isinstance(error, ev.ErrorEvent)
    assert (error.code, error.message) == ("input_audio_buffer_commit_empty", "Input audio buffer is empty")
    assert session.commits == 0


async def test_a_response_requested_at_commit_waits_for_the_transcript(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine, SessionConfig(instructions="Be kind."))
    session.commit_gate = gate = asyncio.Event()
    handle.submit(cmd.AppendAudio(audio=SPEECH))
    handle.submit(cmd.Commit())
    handle.submit(cmd.ResponseCreate())
    events = await take_ready(handle.attachment)
    assert names(events)[:2] == ["InputCommitted", "ItemAdded"]
    assert "ResponseCreated" in names(events)  # created at once ...
    assert session.responses == []  # ... but the engine waits for the user's words
    gate.set()
    await settle()
    [request] = session.responses
    assert [(m.role, m.content) for m in request.messages] == [("system", "Be kind."), ("user", "hello there")]
    completed = of_type(await take_ready(handle.attachment), ev.InputTranscriptCompleted)
    assert completed[0].transcript == "hello there"


async def test_a_failed_commit_reports_an_error_and_does_not_stall_the_response(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine)
    session.commit_error = EngineError("asr died", code="asr_failed")
    handle.submit(cmd.AppendAudio(audio=SPEECH))
    handle.submit(cmd.Commit(response_create=True))
    events = await take_ready(handle.attachment)
    assert [e.code for e in of_type(events, ev.ErrorEvent)] == ["asr_failed"]
    assert len(session.responses) == 1


async def test_a_missing_final_transcript_is_bounded_by_the_injected_clock(engine, make_manager, clock) -> None:
    _, handle, session = await open_session(make_manager, engine, input_transcript_timeout_s=3.0)
    session.transcript_on_commit = None
    handle.submit(cmd.AppendAudio(audio=SPEECH))
    handle.submit(cmd.Commit(response_create=True))
    await settle()
    assert session.responses == []
    clock.advance(3.0)
    await settle()
    assert len(session.responses) == 1


async def test_server_vad_turn_commits_responds_and_barges_in(engine, make_manager) -> None:
    config = SessionConfig(turn_detection=TurnDetection())
    _, handle, session = await open_session(make_manager, engine, config)
    assert session.options.server_vad is not None and session.options.server_vad.type == "server_vad"
    handle.submit(cmd.AppendAudio(audio=SPEECH))
    session.emit(SpeechStarted(audio_ms=20))
    session.emit(SpeechStopped(audio_ms=900))
    events = await take_ready(handle.attachment)
    started, stopped = of_type(events, ev.SpeechStarted)[0], of_type(events, ev.SpeechStopped)[0]
    committed = of_type(events, ev.InputCommitted)[0]
    assert started.item_id == stopped.item_id == committed.item_id
    assert (started.audio_start_ms, stopped.audio_end_ms) == (20, 900)
    [request] = session.responses  # create_response: the VAD turn was answered
    session.audio(request.response_id, text="Sure")
    await settle()
    session.emit(SpeechStarted(audio_ms=1500))  # the user talks over the answer
    events = await take_ready(handle.attachment)
    [decision] = of_type(events, ev.OverlapDecided)
    assert (decision.action, decision.reason) == ("barge_in", "server_vad")
    assert (of_type(events, ev.ResponseDone)[0].status_details or {}).get("reason") == "barge_in"
    assert handle.epoch == 1


async def test_overlap_without_interrupt_response_keeps_the_answer_going(engine, make_manager) -> None:
    config = SessionConfig(turn_detection=TurnDetection(interrupt_response=False))
    _, handle, session = await open_session(make_manager, engine, config)
    response_id = await start_response(handle, session)
    session.emit(SpeechStarted(audio_ms=10))
    events = await take_ready(handle.attachment)
    assert of_type(events, ev.OverlapDecided)[0].action == "listen"
    assert handle.active_response_id == response_id and handle.epoch == 0


async def test_vad_events_are_ignored_in_manual_turn_mode(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine)
    session.emit(SpeechStarted(audio_ms=0))
    session.emit(SpeechStopped(audio_ms=100))
    assert await take_ready(handle.attachment) == []
    assert session.commits == 0


async def test_a_vad_turn_during_an_answer_is_deferred_until_the_answer_ends(engine, make_manager) -> None:
    config = SessionConfig(turn_detection=TurnDetection(interrupt_response=False))
    _, handle, session = await open_session(make_manager, engine, config)
    first = await start_response(handle, session)
    handle.submit(cmd.AppendAudio(audio=SPEECH))
    session.emit(SpeechStarted(audio_ms=0))
    session.emit(SpeechStopped(audio_ms=500))
    await settle()
    assert len(session.responses) == 1
    session.finish(first)
    await settle()
    assert len(session.responses) == 2  # promoted once the first answer ended


async def test_overlap_decision_commands(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine)
    await start_response(handle, session)
    handle.submit(cmd.OverlapDecision(action="drop", overlap_ms=120))
    handle.submit(cmd.OverlapDecision(action="barge_in"))
    events = await take_ready(handle.attachment)
    decisions = of_type(events, ev.OverlapDecided)
    assert [(d.action, d.policy, d.overlap_ms) for d in decisions] == [
        ("drop", "client", 120),
        ("barge_in", "client", None),
    ]
    assert session.clears == 1 and handle.epoch == 1


async def test_text_responses_stream_text_deltas(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine)
    handle.submit(cmd.ResponseCreate(modalities=("text",), instructions="Answer in text"))
    await settle()
    [request] = session.responses
    assert request.modalities == ("text",) and request.messages[0].content == "Answer in text"
    session.emit(OutputText("Hi", 0, request.response_id))
    session.finish(request.response_id)
    events = await take_ready(handle.attachment)
    assert [e.delta for e in of_type(events, ev.TextDelta)] == ["Hi"]
    assert of_type(events, ev.TextDone)[0].text == "Hi"
    assert of_type(events, ev.AudioDelta) == []


async def test_engine_audio_is_resampled_to_the_session_output_rate(make_manager) -> None:
    engine = TestDoubleEngine(output_sample_rate=16000)
    _, handle, session = await open_session(make_manager, engine)
    response_id = await start_response(handle, session)
    for _ in range(5):
        session.audio(response_id, samples=1600)  # 100 ms at 16 kHz
    session.finish(response_id)
    events = await take_ready(handle.attachment)
    deltas = of_type(events, ev.AudioDelta)
    assert all(d.sample_rate == 24000 for d in deltas)
    assert sum(len(d.pcm) for d in deltas) == pytest.approx(5 * 2400, abs=48)  # the tail is flushed


async def test_engine_failures_become_error_events_and_the_session_stays_usable(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine)
    session.emit(EngineFailure("tts_failed", "voice model crashed"))

    session.push_error = EngineError("bad frame", code="invalid_audio")
    handle.submit(cmd.AppendAudio(audio=SPEECH, event_id="a1"))
    handle.submit(cmd.Heartbeat())
    events = await take_ready(handle.attachment)
    errors = {e.code: e for e in of_type(events, ev.ErrorEvent)}
    assert set(errors) == {"tts_failed", "invalid_audio"}
    assert all(e.error_type == "server_error" for e in errors.values())
    assert errors["invalid_audio"].related_event_id == "a1"
    assert of_type(events, ev.HeartbeatAck)


async def test_session_update_echoes_the_effective_config_or_refuses_with_the_field(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine)
    handle.submit(cmd.SessionUpdate(changes={"voice": "verse", "output_audio_format": "g711_ulaw"}))
    handle.submit(cmd.SessionUpdate(changes={"temperature": 9}, event_id="bad"))
    handle.submit(cmd.SessionUpdate(changes={"no_such_field": 1}, event_id="worse"))
    events = await take_ready(handle.attachment)
    [updated] = of_type(events, ev.SessionUpdated)
    assert updated.session.config.voice == "verse"
    assert updated.session.config.output_sample_rate == 8000
    errors = of_type(events, ev.ErrorEvent)
    assert [(e.code, e.param, e.related_event_id) for e in errors] == [
        ("invalid_value", "temperature", "bad"),
        ("invalid_value", "no_such_field", "worse"),
    ]
    assert handle.config.voice == "verse"
    await start_response(handle, session)
    assert session.responses[-1].voice == "verse"


async def test_conversation_items_can_be_created_retrieved_truncated_and_deleted(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine)
    handle.submit(cmd.ConversationItemCreate(role="user", text="What is 2+2?", item_id="q1"))
    handle.submit(
        cmd.ConversationItemCreate(role="system", text="Answer briefly.", previous_item_id="nope", event_id="e1")
    )
    handle.submit(cmd.ConversationItemRetrieve(item_id="q1"))
    response_id = await start_response(handle, session)
    session.audio(response_id, samples=24000, text="Four, of course")  # 1 s
    session.finish(response_id)
    await settle()
    item_id = f"item_{response_id}"
    handle.submit(cmd.ConversationItemTruncate(item_id=item_id, audio_end_ms=5000, event_id="too-far"))
    handle.submit(cmd.ConversationItemTruncate(item_id=item_id, audio_end_ms=400))
    handle.submit(cmd.ConversationItemDelete(item_id="q1"))
    handle.submit(cmd.ConversationItemDelete(item_id="q1", event_id="gone"))
    events = await take_ready(handle.attachment)
    assert [(e.code, e.related_event_id) for e in of_type(events, ev.ErrorEvent)] == [
        ("item_not_found", "e1"),
        ("invalid_value", "too-far"),
        ("item_not_found", "gone"),
    ]
    assert of_type(events, ev.ItemRetrieved)[0].item.text == "What is 2+2?"
    assert of_type(events, ev.ItemTruncated)[0].audio_end_ms == 400
    assert of_type(events, ev.ItemDeleted)[0].item_id == "q1"
    assert session.responses[0].messages[-1].content == "What is 2+2?"
    assert [(m.role, m.content) for m in handle.history] == [("assistant", "Four, ")]  # 40 % heard


async def test_ack_only_commits_the_acknowledged_share_of_the_answer(engine, make_manager) -> None:
    config = SessionConfig(playback_commit_policy="ack_only")
    _, handle, session = await open_session(make_manager, engine, config)
    response_id = await start_response(handle, session)
    session.audio(response_id, samples=24000, text="abcdefghij")  # 1000 ms sent
    await settle()
    handle.submit(cmd.PlaybackAck(response_id=response_id, played_ms=500, committed_ms=500))
    session.finish(response_id)
    events = await take_ready(handle.attachment)
    [ack] = of_type(events, ev.PlaybackAcknowledged)
    assert (ack.played_ms, ack.committed_ms, ack.history_committed) == (500, 500, True)
    assert [m.content for m in handle.history] == ["abcde"]


async def test_ack_only_rejects_an_ack_that_would_land_after_a_newer_commit(engine, make_manager) -> None:
    config = SessionConfig(playback_commit_policy="ack_only")
    _, handle, session = await open_session(make_manager, engine, config)
    response_id = await start_response(handle, session)
    session.audio(response_id, samples=24000, text="abcdefghij")
    session.finish(response_id)
    await settle()
    handle.submit(cmd.PlaybackAck(response_id=response_id, played_ms=300))  # right order: ack first
    handle.submit(cmd.AppendAudio(audio=SPEECH))
    handle.submit(cmd.Commit())
    handle.submit(cmd.PlaybackAck(response_id=response_id, played_ms=800, event_id="late"))
    handle.submit(cmd.PlaybackAck(response_id="resp_unknown", played_ms=1, event_id="who"))
    events = await take_ready(handle.attachment)
    assert [(e.code, e.related_event_id) for e in of_type(events, ev.ErrorEvent)] == [
        ("playback_ack_out_of_order", "late"),
        ("unknown_response", "who"),
    ]
    assert [m.content for m in handle.history] == ["abc", "hello there"]


async def test_barge_in_keeps_what_was_played_in_history(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine)
    response_id = await start_response(handle, session)
    session.audio(response_id, samples=24000, text="0123456789")
    await settle()
    handle.submit(cmd.PlaybackAck(response_id=response_id, played_ms=300))
    handle.submit(cmd.BargeIn())
    await take_ready(handle.attachment)
    assert [m.content for m in handle.history] == ["012"]


async def test_a_cancelled_answer_without_acks_keeps_what_was_sent(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine)
    response_id = await start_response(handle, session)
    session.audio(response_id, text="partial answer")
    await settle()
    handle.submit(cmd.ResponseCancel())
    await take_ready(handle.attachment)
    assert [m.content for m in handle.history] == ["partial answer"]


async def test_a_failed_response_never_enters_history(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine)
    response_id = await start_response(handle, session)
    session.audio(response_id, text="wrong")
    session.finish(response_id, status="failed")
    events = await take_ready(handle.attachment)
    done = of_type(events, ev.ResponseDone)[0]
    assert (done.status, done.committed) == ("failed", False)
    assert handle.history == ()


async def test_clear_input_and_clear_output(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine)
    handle.submit(cmd.AppendAudio(audio=SPEECH))
    handle.submit(cmd.Clear(target="input"))
    handle.submit(cmd.Commit(event_id="nothing-left"))
    response_id = await start_response(handle, session)
    session.audio(response_id)
    await settle()
    handle.submit(cmd.Clear(target="output"))
    events = await take_ready(handle.attachment)
    assert session.clears == 1
    assert of_type(events, ev.InputCleared)
    assert of_type(events, ev.ErrorEvent)[0].code == "input_audio_buffer_commit_empty"
    assert of_type(events, ev.AudioDelta) == []
    assert (of_type(events, ev.ResponseDone)[0].status_details or {}).get("reason") == "output_cleared"
    assert handle.epoch == 1


async def test_control_signals_report_their_effect_when_asked(engine, make_manager) -> None:
    """``runtime.control`` (docs/sessions.md#duplex-extensions): with ``emit_control_results`` every control signal
    says what it did; a turn engine honours a cancel in full."""
    _, handle, session = await open_session(make_manager, engine, SessionConfig(emit_control_results=True))
    response_id = await start_response(handle, session)
    session.audio(response_id)
    await settle()
    handle.submit(cmd.ResponseCancel(event_id="stop"))
    handle.submit(cmd.ResponseCancel(event_id="again"))  # nothing left to cancel: an error, no result
    events = await take_ready(handle.attachment)
    results = [e.result for e in of_type(events, ev.RuntimeControl)]
    assert results == [
        {
            "signal": "cancel_response",
            "ok": True,
            "applied": ["epoch_advanced", "response_cancelled"],
            "unsupported": [],
        }
    ]
    assert of_type(events, ev.ResponseDone)[0].status == "cancelled"
    assert of_type(events, ev.ErrorEvent)[0].related_event_id == "again"
    assert session.epochs[-1] == 1


async def test_speech_after_the_answer_was_delivered_is_an_ordinary_turn(engine, make_manager) -> None:
    config = SessionConfig(turn_detection=TurnDetection())
    _, handle, session = await open_session(make_manager, engine, config)
    response_id = await start_response(handle, session)
    session.audio(response_id)
    session.finish(response_id)
    await take_ready(handle.attachment)  # the client has everything
    session.emit(SpeechStarted(audio_ms=3000))
    events = await take_ready(handle.attachment)
    assert names(events) == ["SpeechStarted"]
    assert handle.epoch == 0


async def test_speech_over_queued_audio_of_a_finished_answer_clears_it(engine, make_manager) -> None:
    config = SessionConfig(turn_detection=TurnDetection())
    _, handle, session = await open_session(make_manager, engine, config)
    response_id = await start_response(handle, session)
    session.audio(response_id)
    session.finish(response_id)
    await settle()  # finished, but the client has not read the audio yet
    session.emit(SpeechStarted(audio_ms=100))
    events = await take_ready(handle.attachment)
    assert of_type(events, ev.AudioDelta) == []
    assert of_type(events, ev.OverlapDecided)[0].action == "barge_in"
    assert of_type(events, ev.OutputAudioCleared)[0].response_id == response_id


async def test_an_audio_answer_asks_the_engine_for_audio_only(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine)  # session modalities: audio + text
    await start_response(handle, session)
    assert session.responses[0].modalities == ("audio",)  # the transcript rides on the audio chunks
