"""The young batch (docs/engines.md#young-batch): a new reply steps through its audio delay in a
small pre-audio-only model on the same weights, then its row moves into the main batch, where it
speaks on exactly as if it had been stepped there from its first frame, sampled tokens and
audio included; ``TTSFrameModel`` runs the young batch between the main batch's full steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from rtserve.engines.errors import EngineError
from rtserve.engines.kyutai_tts.frame_model import TTSFrameModel
from rtserve.engines.kyutai_tts.loader import load_folder
from rtserve.engines.kyutai_tts.model import KyutaiTTSModel, StepOutputs, TTSSettings
from rtserve.engines.kyutai_tts.script import ScriptSplitter
from rtserve.engines.kyutai_tts.voices import VoiceFolder
from rtserve.engines.values import FrameOutput
from rtserve.errors import INPUT_BACKPRESSURE
from rtserve.weights.source import WeightSource
from tests.engines.kyutai_tts.test_pre_audio_steps import DEVICES, TEXT, same_frame, start
from tests.engines.kyutai_tts.tiny import VOICE_DIM, VOICE_FRAMES, TinyTTS


def models(tiny: TinyTTS, device: str, cfg_coef: float) -> tuple[KyutaiTTSModel, ...]:
    """The main batch (3 slots), a young batch of 2 beside it on the same weights, and two
    main-sized models to compare with."""
    loaded = load_folder(tiny.folder, device=torch.device(device), dtype=torch.float32)
    settings = TTSSettings(temperature=0.8, cfg_coef=cfg_coef, voice_frames=VOICE_FRAMES)
    voices = VoiceFolder(
        WeightSource(tiny.voices, "voices", progress_interval_s=1), loaded.arch.voice_suffix, VOICE_DIM, VOICE_FRAMES
    )
    main = KyutaiTTSModel(loaded, 3, settings=settings, voices=voices)
    nursery = KyutaiTTSModel(loaded.sharing_weights(), 2, settings=settings, voices=voices, pre_audio_only=True)
    others = [
        KyutaiTTSModel(
            load_folder(tiny.folder, device=torch.device(device), dtype=torch.float32),
            3,
            settings=settings,
            voices=voices,
        )
        for _ in "ab"
    ]
    return main, nursery, *others


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", ["distilled", "direct"])
def test_a_reply_moved_from_the_young_batch_speaks_as_if_stepped_in_the_main_batch(
    tiny_tts: TinyTTS, tiny_tts_direct_cfg: TinyTTS, device: str, cfg: str
) -> None:
    tiny, cfg_coef = (tiny_tts, 2.0) if cfg == "distilled" else (tiny_tts_direct_cfg, 3.0)
    main, nursery, older, alone = models(tiny, device, cfg_coef)
    # Slot 0 of the main batch is an older reply, past its audio delay; ``older`` steps it alike.
    for model in (main, older):
        start(model, 0, "alice", seed=7)
        for _ in range(main.young_steps + 3):
            model.step()
    # The new reply: row 1 of the young batch, then slot 2 of the main batch; ``alone`` steps it
    # in slot 2 from its first frame.
    start(nursery, 1, "bob", seed=11)
    start(alone, 2, "bob", seed=11)
    for _ in range(main.young_steps):
        assert nursery.young_rows().tolist() == [False, True]
        young, stepped = nursery.step(speak=False), alone.step()
        same_frame(young[1], stepped[2])
    main.adopt(2, nursery, 1)
    assert not nursery.young_rows().any() and main.steps[2] == main.young_steps
    heard = 0
    for _ in range(30):  # both speak on, each as stepped alone: no state moved apart
        ours = main.step()
        same_frame(ours[0], older.step()[0])
        same_frame(ours[2], alone.step()[2])
        heard += ours[2] is not None and ours[2].audio is not None
    assert heard > 20


@dataclass
class Replies:
    kinds: list[str]  # every step's kind
    call_kinds: list[list[str]]  # the same, call by call
    audio: dict[int, list[np.ndarray]]  # each row's frames
    word_starts: dict[int, list[int]]  # each row's words' first steps, as its outputs said
    calls: int  # calls after the new rows began
    found_full: list[None]  # one per reply that found the young batch full
    seated: list[tuple[float, bool]]  # per reply as it took its row: seconds waited, in the young batch
    frame_model: TTSFrameModel
    young_step_rows: list[int]  # the rows each young-batch step computed


def _replies(
    tiny: TinyTTS,
    young_rows: int,
    call_s: float = 0.0,
    device: str = "cpu",
    lead_s: float = 0.16,
    young_burst_s: float = 0.0,
    young_queue: int = 1,
    young_span_bucket: int = 0,
    young_row_bucket: int = 0,
    young_wait_s: float = 0.0,
) -> Replies:
    """Row 0 speaks 2 frames ahead (the clock stands still), then rows 1 and 2 begin and the
    clock moves ``call_s`` a call, until both new rows have made 3 frames. Greedy, so the audio
    is each row's own whatever the batch it stepped in."""
    kinds: list[str] = []
    now = [0.0]
    loaded = load_folder(tiny.folder, device=torch.device(device), dtype=torch.float32)
    voices = VoiceFolder(
        WeightSource(tiny.voices, "voices", progress_interval_s=1), loaded.arch.voice_suffix, VOICE_DIM, VOICE_FRAMES
    )
    settings = TTSSettings(temperature=0.0, cfg_coef=2.0, voice_frames=VOICE_FRAMES)
    main = KyutaiTTSModel(loaded, 3, settings=settings, voices=voices)
    young = None
    if young_rows:
        young = KyutaiTTSModel(
            main.loaded.sharing_weights(),
            young_rows,
            settings=main.settings,
            voices=main.voices,
            pre_audio_only=True,
            span_bucket=young_span_bucket,
            row_bucket=young_row_bucket,
        )
    found_full: list[None] = []
    seated: list[tuple[float, bool]] = []
    young_step_rows: list[int] = []

    def stepped(kind: str) -> None:
        kinds.append(kind)
        if kind == "young_batch" and young is not None:
            young_step_rows.append(young.step_rows)

    frame_model = TTSFrameModel(
        main,
        young=young,
        on_young_batch_full=lambda: found_full.append(None),
        on_seated=lambda waited, young: seated.append((round(waited, 6), young)),
        catch_up_lead_s=lead_s,
        young_burst_s=young_burst_s,
        young_queue=young_queue,
        young_wait_s=young_wait_s,
        clock=lambda: now[0],
        on_step=stepped,
    )
    splitter = ScriptSplitter(main.tokenizer, speaker_token=main.ids.main, frame_rate=main.frame_rate)
    audio: dict[int, list[np.ndarray]] = {0: [], 1: [], 2: []}
    silence, live = np.zeros((3, 1920), np.float32), np.ones(3, bool)
    for slot, voice in ((0, "alice"), (1, "bob"), (2, "alice")):
        frame_model.begin(slot, main.resolve_voice(voice), None)
        frame_model.push(slot, splitter.split(TEXT))
        frame_model.end(slot)
        while slot == 0 and len(audio[0]) < 2:
            output = frame_model.step(silence, np.arange(3) == 0)[0]
            if output is not None and output.audio.size:
                audio[0].append(output.audio)
    kinds.clear()
    young_step_rows.clear()
    call_kinds: list[list[str]] = []
    word_starts: dict[int, list[int]] = {1: [], 2: []}
    for calls in range(1, 200):
        now[0] += call_s
        before = len(kinds)
        outputs = frame_model.step(silence, live)
        call_kinds.append(kinds[before:])
        for slot, output in enumerate(outputs):
            if output is not None and output.audio.size:
                audio[slot].append(output.audio)
            if output is not None and output.speech is not None and slot in word_starts:
                word_starts[slot] += output.speech.word_starts
        if min(len(audio[1]), len(audio[2])) >= 3:
            return Replies(
                kinds, call_kinds, audio, word_starts, calls, found_full, seated, frame_model, young_step_rows
            )
    raise AssertionError("the new replies made no audio")


@pytest.mark.parametrize("device", DEVICES)
def test_new_replies_step_in_the_young_batch_then_speak_with_the_others_in_their_own_voices(
    tiny_tts: TinyTTS, device: str
) -> None:
    replies = _replies(tiny_tts, young_rows=2, device=device)
    kinds, audio, young_steps = replies.kinds, replies.audio, replies.frame_model.model.young_steps
    # Both new replies went through their audio delay together in the young batch, while row 0
    # was far enough ahead; then, nobody young left, full steps of the main batch make
    # everyone's audio.
    assert kinds[:young_steps] == ["young_batch"] * young_steps
    assert kinds[young_steps:] == ["full_no_young"] * (len(kinds) - young_steps)
    alone = _replies(tiny_tts, young_rows=0, device=device).audio  # the same replies, all in the main batch
    for slot in range(3):
        for ours, theirs in zip(audio[slot], alone[slot], strict=False):
            np.testing.assert_allclose(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_a_large_young_batch_steps_only_its_busy_rows_and_says_the_same(tiny_tts: TinyTTS, device: str) -> None:
    # Two new replies in a young batch of 4 rows, stepped in buckets of one row: they take rows 0
    # and 1, each young step computes those 2 rows, and every reply sounds as with every row stepped.
    bucketed = _replies(tiny_tts, young_rows=4, device=device, young_row_bucket=1)
    whole = _replies(tiny_tts, young_rows=4, device=device)
    young_steps = bucketed.frame_model.model.young_steps
    assert bucketed.kinds == whole.kinds and bucketed.kinds[:young_steps] == ["young_batch"] * young_steps
    assert bucketed.young_step_rows == [2] * young_steps and whole.young_step_rows == [4] * young_steps
    for slot in range(3):
        for ours, theirs in zip(bucketed.audio[slot], whole.audio[slot], strict=True):
            np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_a_reply_that_finds_the_young_batch_full_starts_in_the_main_batch(tiny_tts: TinyTTS) -> None:
    replies = _replies(tiny_tts, young_rows=1)
    kinds, audio, frame_model = replies.kinds, replies.audio, replies.frame_model
    assert len(replies.found_full) == 1  # row 2 (row 0 had gone through it before row 1 took it)
    # Row 1 took the young batch's one row; row 2 catches up in the main batch's pre-audio
    # steps, taking turns with it.
    assert {"young_batch", "pre_audio"} <= set(kinds)
    assert frame_model.young is not None and not frame_model.young.young_rows().any()
    assert all(len(frames) >= 3 for frames in audio.values())


@pytest.mark.parametrize("device", DEVICES)
def test_a_reply_that_finds_the_young_batch_full_waits_for_its_row_with_its_text(
    tiny_tts: TinyTTS, device: str
) -> None:
    # The clock stands still, so row 2 waits as long as it takes: its words and end, sent while it
    # waited, go in when row 1 moves on, and it steps through its delay in the young batch too.
    replies = _replies(tiny_tts, young_rows=1, device=device, young_wait_s=1.0)
    young_steps = replies.frame_model.model.young_steps
    assert len(replies.found_full) == 1
    assert replies.kinds.count("young_batch") == 2 * young_steps and "pre_audio" not in replies.kinds
    alone = _replies(tiny_tts, young_rows=0, device=device).audio  # the same replies, all in the main batch
    for slot in range(3):
        for ours, theirs in zip(replies.audio[slot], alone[slot], strict=False):
            np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_a_reply_waits_for_a_young_row_no_longer_than_its_bound(tiny_tts: TinyTTS) -> None:
    # A frame of real time a call, one young step a call: row 1 holds the young row for its whole
    # delay. Row 2, bound to wait 0.1 s, starts in the main batch on the second call and steps
    # there (one step a call); waiting longer, it steps only once row 1 has moved on.
    replies = _replies(tiny_tts, young_rows=1, call_s=0.08, young_wait_s=0.1)
    patient = _replies(tiny_tts, young_rows=1, call_s=0.08, young_wait_s=10.0)
    young_steps = replies.frame_model.model.young_steps
    assert len(replies.found_full) == len(patient.found_full) == 1
    assert replies.calls <= young_steps + 5 < 2 * young_steps <= patient.calls
    # Rows 0 and 1 took a young row at once; row 2 took its row after waiting: the main batch's
    # at the first call past its bound, or (patient) row 1's when it moved on.
    assert replies.seated == [(0.0, True), (0.0, True), (0.16, False)]
    assert patient.seated[:2] == [(0.0, True), (0.0, True)] and patient.seated[2][1]
    assert patient.seated[2][0] >= 0.08 * (young_steps - 1)
    alone = _replies(tiny_tts, young_rows=0, call_s=0.08).audio
    for slot in range(3):
        for ours, theirs in zip(replies.audio[slot], alone[slot], strict=False):
            np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_a_waiting_reply_holds_no_more_words_than_a_row(tiny_tts: TinyTTS) -> None:
    replies = _replies(tiny_tts, young_rows=1)  # its young row is free again: take it, then wait
    model = replies.frame_model
    voice = model.model.resolve_voice("bob")
    model.begin(1, voice, None)
    model.begin(2, voice, None)
    splitter = ScriptSplitter(model.model.tokenizer, speaker_token=model.model.ids.main, frame_rate=12.5)
    words = splitter.split(" ".join(["fox"] * (model.max_words + 1)))
    model.push(2, words[: model.max_words])
    with pytest.raises(EngineError) as refused:
        model.push(2, words[model.max_words :])
    assert refused.value.code == INPUT_BACKPRESSURE


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("lead_s", "reason", "spare"),
    [(0.12, "full_lead_short", True), (0.2, "full_lead_short", False), (0.0, "full_no_catch_up", True)],
)
def test_the_young_batch_steps_beside_the_full_steps_older_replies_need(
    tiny_tts: TinyTTS, device: str, lead_s: float, reason: str, spare: bool
) -> None:
    # A frame of real time a call: row 0, 80 ms ahead of its playback, is short of its lead at
    # every call (or catching up is off), so every call is a full step of the main batch, and the
    # young batch steps beside each (on CUDA, on a stream of its own, as many steps as fit in the
    # full step's time: the same audio as without it, below, so neither step raced the other).
    replies = _replies(tiny_tts, young_rows=2, call_s=0.08, device=device, lead_s=lead_s)
    calls, young_steps = replies.call_kinds, replies.frame_model.model.young_steps
    for kinds in calls:  # one full step a call
        assert [kind for kind in kinds if kind != "young_batch"] in ([reason], ["full_no_young"])
    young_per_call = [kinds.count("young_batch") for kinds in calls]
    through = young_per_call.index(0)
    assert through and sum(young_per_call) == young_steps  # beside each full step until through the delay
    if device == "cpu":  # a CPU's full step is over when the young batch's begins: one each
        assert young_per_call[:through] == [1] * young_steps
    # The call whose young steps take the replies through their delay runs those steps before its
    # full step, which makes their first audio: they speak from that call on, as soon as if they had
    # taken every full step with row 0 (and a call sooner than adopted after it). Only while row 0
    # has lead to spare over half the catch-up lead (80 ms over 60, 80 ms over none): under it
    # (80 ms under 100) its step waits for nothing, and the replies speak a call later.
    assert (calls[through - 1][0] == "young_batch") is spare and calls[0][0] != "young_batch"
    assert replies.calls == through + (2 if spare else 3)  # their third frame two calls after the first
    assert len(replies.audio[0]) == 2 + len(calls)
    alone = _replies(tiny_tts, young_rows=0, call_s=0.08, device=device, lead_s=lead_s).audio
    for slot in range(3):
        for ours, theirs in zip(replies.audio[slot], alone[slot], strict=False):
            np.testing.assert_allclose(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_where_only_the_young_batch_steps_its_steps_go_on_back_to_back(tiny_tts: TinyTTS, device: str) -> None:
    one_a_call = _replies(tiny_tts, young_rows=2, device=device)
    # The clock stands still, so the burst never runs out: one call takes both new replies
    # through their whole audio delay (row 0 is ahead; the main batch does not step).
    burst = _replies(tiny_tts, young_rows=2, device=device, young_burst_s=0.02)
    young_steps = burst.frame_model.model.young_steps
    assert burst.kinds[:young_steps] == ["young_batch"] * young_steps == one_a_call.kinds[:young_steps]
    assert burst.calls == one_a_call.calls - young_steps + 1
    for slot in range(3):  # the same audio, and the same word timings though a call merged steps
        for ours, theirs in zip(burst.audio[slot], one_a_call.audio[slot], strict=True):
            np.testing.assert_allclose(ours, theirs, atol=1e-5)
    assert burst.word_starts == one_a_call.word_starts
    assert all(starts and starts[0] < young_steps for starts in burst.word_starts.values())  # begun inside the burst


@pytest.mark.parametrize("device", DEVICES)
def test_young_steps_queued_ahead_of_their_reads_make_the_same_replies(tiny_tts: TinyTTS, device: str) -> None:
    # Each step launched before the host has read the ones before it: it must attend as far as
    # those steps will have taken its rows (a span of 2 ring slots a graph, so a step short of
    # that misses the last key), and on CUDA its outputs must outlive the next replay of the graph.
    read_each = _replies(tiny_tts, young_rows=2, device=device, young_burst_s=0.02, young_span_bucket=2)
    queued = _replies(tiny_tts, young_rows=2, device=device, young_burst_s=0.02, young_span_bucket=2, young_queue=3)
    young_steps = queued.frame_model.model.young_steps
    assert queued.kinds[:young_steps] == ["young_batch"] * young_steps
    assert queued.calls == read_each.calls
    for slot in range(3):
        for ours, theirs in zip(queued.audio[slot], read_each.audio[slot], strict=True):
            np.testing.assert_allclose(ours, theirs, atol=1e-5)
    assert queued.word_starts == read_each.word_starts


def test_a_finishing_burst_is_sized_by_the_young_steps_run_alone(tiny_tts: TinyTTS) -> None:
    # Young steps beside a main step are slow (the GPU is shared: 12 ms a step here), alone fast (3
    # ms). A reply whose whole audio delay fits in a burst of those fast steps goes through it in the
    # call it begins, before the main step, however slow the bursts beside main steps were.
    main, nursery = models(tiny_tts, "cpu", 2.0)[:2]
    now, beside = [0.0], [False]
    main_launch, young_launch = main.launch, nursery.launch

    def launched_main(*args: Any, **kwargs: Any) -> StepOutputs:
        beside[0] = True
        return main_launch(*args, **kwargs)

    def launched_young(*args: Any, **kwargs: Any) -> StepOutputs:
        now[0] += 0.012 if beside[0] else 0.003
        return young_launch(*args, **kwargs)

    main.launch, nursery.launch = launched_main, launched_young  # type: ignore[method-assign]
    frame_model = TTSFrameModel(main, young=nursery, young_burst_s=0.04, clock=lambda: now[0])
    splitter = ScriptSplitter(main.tokenizer, speaker_token=main.ids.main, frame_rate=main.frame_rate)
    silence, live = np.zeros((3, 1920), np.float32), np.ones(3, bool)

    def call() -> list[FrameOutput | None]:
        beside[0] = False
        return frame_model.step(silence, live)

    def begin(slot: int) -> None:
        frame_model.begin(slot, main.resolve_voice("alice"), None)
        frame_model.push(slot, splitter.split(TEXT))
        frame_model.end(slot)

    begin(0)
    made = 0
    while made < 2:  # the clock stands still: 160 ms of audio made
        output = call()[0]
        made += output is not None and output.audio.size > 0
    now[0] = 0.36  # row 0 is 200 ms behind its playback: the young steps go beside its steps
    begin(1)
    calls = 1
    while not (output := call()[1]) or not output.audio.size:
        calls += 1
        assert calls < 30, "reply 1 made no audio"
    assert calls >= 4  # it went through most of its delay in bursts beside main steps
    for _ in range(10):  # no young row: the clock stands still, the older replies get ahead
        call()
    begin(2)
    first = call()[2]
    assert first is not None and first.audio.size  # its whole delay and first audio in one call
