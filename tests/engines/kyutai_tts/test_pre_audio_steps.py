"""Pre-audio steps (docs/engines.md#pre-audio-steps): a row inside its audio delay steps with the
depformer over its leading codebook alone and no decoder and comes out exactly as with full
steps, sampled tokens included; a row past its delay never steps in one; ``TTSFrameModel`` runs
new replies' pre-audio steps alone while older replies are far enough ahead of playback, and
every row's audio is still the model's own."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rtserve.engines.kyutai_tts.frame_model import TTSFrameModel
from rtserve.engines.kyutai_tts.loader import load_folder
from rtserve.engines.kyutai_tts.model import KyutaiTTSModel, StepOutputs, TTSFrame, TTSSettings
from rtserve.engines.kyutai_tts.script import ScriptSplitter
from rtserve.engines.kyutai_tts.voices import VoiceFolder
from rtserve.weights.source import WeightSource
from tests.engines.kyutai_tts.test_tts_parity import engine
from tests.engines.kyutai_tts.tiny import VOICE_DIM, VOICE_FRAMES, TinyTTS

TEXT = "the quick brown fox jumps over the lazy dog and runs far away"
NO_INPUT = np.zeros((2, 1920), np.float32)
LIVE = np.ones(2, bool)


DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")),
]


def sampled_model(tiny: TinyTTS, device: str = "cpu", *, tried_steps: bool = True) -> KyutaiTTSModel:
    """On CUDA both kinds of step replay as captured graphs."""
    loaded = load_folder(tiny.folder, device=torch.device(device), dtype=torch.float32)
    settings = TTSSettings(temperature=0.8, cfg_coef=2.0, voice_frames=VOICE_FRAMES)
    voices = VoiceFolder(
        WeightSource(tiny.voices, "voices", progress_interval_s=1), loaded.arch.voice_suffix, VOICE_DIM, VOICE_FRAMES
    )
    return KyutaiTTSModel(loaded, 2, settings=settings, voices=voices, tried_steps=tried_steps)


def start(model: KyutaiTTSModel, slot: int, voice: str, seed: int) -> None:
    model.open_slot(slot, model.resolve_voice(voice), seed)
    splitter = ScriptSplitter(model.tokenizer, speaker_token=model.ids.main, frame_rate=model.frame_rate)
    for word in splitter.split(TEXT):
        model.push_word(slot, list(word.tokens), word.padding)
    model.end_of_stream(slot)


def same_frame(ours: TTSFrame | None, full: TTSFrame | None) -> None:
    assert ours is not None and full is not None
    assert (ours.stepped, ours.words_started, ours.done) == (full.stepped, full.words_started, full.done)
    assert (ours.codes is None) == (full.codes is None) and (ours.audio is None) == (full.audio is None)
    if ours.codes is not None and full.codes is not None:
        np.testing.assert_array_equal(ours.codes, full.codes)
    if ours.audio is not None and full.audio is not None:
        np.testing.assert_array_equal(ours.audio, full.audio)


@pytest.mark.parametrize("device", DEVICES)
def test_a_young_row_steps_pre_audio_exactly_as_with_full_steps_sampled(tiny_tts: TinyTTS, device: str) -> None:
    ours, full = sampled_model(tiny_tts, device), sampled_model(tiny_tts, device)
    for model in (ours, full):
        start(model, 0, "alice", seed=7)
        for _ in range(ours.young_steps + 3):  # row 0 is past its audio delay
            model.step()
        start(model, 1, "bob", seed=11)
    only_new = np.array([False, True])
    for _ in range(ours.young_steps):
        assert ours.young_rows().tolist() == [False, True]
        pre_audio, stepped = ours.step(only_new, speak=False), full.step(only_new)
        same_frame(pre_audio[1], stepped[1])
        assert pre_audio[1] is not None and pre_audio[1].stepped
    assert not ours.young_rows().any()
    for _ in range(30):  # both rows speak on: no state (KV, decoder, draws, text machine) moved apart
        for mine, theirs in zip(ours.step(), full.step(), strict=True):
            same_frame(mine, theirs)


def test_a_row_past_its_audio_delay_does_not_step_pre_audio(tiny_tts: TinyTTS) -> None:
    model = sampled_model(tiny_tts)
    start(model, 0, "alice", seed=1)
    for _ in range(model.young_steps):
        model.step()
    steps_before = model.offsets.tolist()
    frame = model.step(speak=False)[0]
    assert frame is not None and not frame.stepped and frame.audio is None
    assert model.offsets.tolist() == steps_before


def _until_first_audio(frame_model: TTSFrameModel, slot: int) -> tuple[list[bool], list[np.ndarray]]:
    """Each call's kind of step (True: full) until ``slot``'s first audio, and row 0's audio by then."""
    kinds: list[bool] = []
    launch = frame_model.model.launch

    def recorded(active: np.ndarray | None = None, *, speak: bool = True, queued: int = 0) -> StepOutputs:
        kinds.append(speak)
        return launch(active, speak=speak, queued=queued)

    frame_model.model.launch = recorded  # type: ignore[method-assign]
    audio: list[np.ndarray] = []
    for _ in range(200):
        outputs = frame_model.step(NO_INPUT, LIVE)
        if outputs[0] is not None and outputs[0].audio.size:
            audio.append(outputs[0].audio)
        new = outputs[slot]
        if new is not None and new.audio.size:
            return kinds, audio
    raise AssertionError("no first audio")


def _second_reply(tiny: TinyTTS, lead_s: float, *, late_s: float) -> tuple[list[bool], list[np.ndarray], int]:
    """Row 0 speaks (its first 2 frames made while the clock stands still), then row 1 opens and
    the clock moves ``late_s`` on: each call's kind of step until row 1's first audio, row 0's
    audio by then, and the model's steps inside the audio delay."""
    now = [0.0]
    frame_model = TTSFrameModel(engine(tiny, 2, cfg_coef=2.0), catch_up_lead_s=lead_s, clock=lambda: now[0])
    model = frame_model.model
    splitter = ScriptSplitter(model.tokenizer, speaker_token=model.ids.main, frame_rate=model.frame_rate)
    frame_model.begin(0, model.resolve_voice("alice"), None)
    frame_model.push(0, splitter.split(TEXT))
    frame_model.end(0)
    made = 0
    while made < 2:
        output = frame_model.step(NO_INPUT, LIVE)[0]
        made += output is not None and output.audio.size > 0
    frame_model.begin(1, model.resolve_voice("bob"), None)
    frame_model.push(1, splitter.split(TEXT))
    frame_model.end(1)
    now[0] += late_s
    return *_until_first_audio(frame_model, 1), model.young_steps


def test_new_replies_step_pre_audio_while_older_ones_are_ahead_and_every_row_keeps_its_own_audio(
    tiny_tts: TinyTTS,
) -> None:
    kinds_full, row0_full, young = _second_reply(tiny_tts, 0.0, late_s=0.0)
    kinds, row0, _ = _second_reply(tiny_tts, 0.16, late_s=0.0)
    # Row 1 steps once a call either way, so its first audio comes on the same call. Without
    # catching up every call is a full step. With it, row 0 is 2 frames (160 ms) ahead: row 1's
    # steps inside its delay go alone, pre-audio; once past it, a full step makes its first audio.
    assert len(kinds) == len(kinds_full) and all(kinds_full)
    assert kinds == [False] * young + [True] * (len(kinds) - young)
    assert len(row0) == len(kinds) - young < len(row0_full)  # row 0 held back, not starved
    for ours, alone in zip(row0, row0_full, strict=False):  # greedy: the same audio, in order
        np.testing.assert_array_equal(ours, alone)


def test_an_older_reply_short_of_lead_steps_before_new_replies_catch_up(tiny_tts: TinyTTS) -> None:
    kinds, _, _ = _second_reply(tiny_tts, 0.16, late_s=0.1)
    # 60 ms ahead: a full step makes it 140 ms (the clock stands still), another 220 ms; then
    # row 1 goes on alone.
    assert kinds[:3] == [True, True, False]


@pytest.mark.parametrize(
    ("lead_s", "late_s", "held_back_by"),
    [(0.0, 0.0, "full_no_catch_up"), (0.16, 0.0, "full_no_young"), (0.16, 0.1, "full_lead_short")],
)
def test_each_step_says_its_kind_and_a_reply_counts_its_full_steps(
    tiny_tts: TinyTTS, lead_s: float, late_s: float, held_back_by: str
) -> None:
    """What the engine's ``rtserve_kyutai_tts_model_steps`` and ``_first_audio_steps`` count."""
    now = [0.0]
    kinds: list[str] = []
    frame_model = TTSFrameModel(
        engine(tiny_tts, 2, cfg_coef=2.0), catch_up_lead_s=lead_s, clock=lambda: now[0], on_step=kinds.append
    )
    model = frame_model.model
    splitter = ScriptSplitter(model.tokenizer, speaker_token=model.ids.main, frame_rate=model.frame_rate)
    for slot, voice in ((0, "alice"), (1, "bob")):
        frame_model.begin(slot, model.resolve_voice(voice), None)
        frame_model.push(slot, splitter.split(TEXT))
        frame_model.end(slot)
        if slot == 0:  # row 0 speaks 2 frames (160 ms ahead while the clock stands still) first
            made = 0
            while made < 2:
                output = frame_model.step(NO_INPUT, np.array([True, False]))[0]
                made += output is not None and output.audio.size > 0
            # Row 0 alone: pre-audio inside its delay, then full steps with nothing young waiting.
            young = model.young_steps
            assert kinds == ["pre_audio"] * young + ["full_no_young"] * (len(kinds) - young)
            kinds.clear()
    now[0] += late_s
    for _ in range(200):
        first = frame_model.step(NO_INPUT, LIVE)[1]
        if first is not None and first.audio.size:
            break
    assert first is not None and first.speech is not None
    full = [kind for kind in kinds if kind != "pre_audio"]
    # Row 1 stepped in every call; it says how many of them were full steps.
    assert first.speech.steps == len(kinds) and first.speech.full_steps == len(full)
    assert held_back_by in full and (lead_s == 0) == ("pre_audio" not in kinds)


def _three_replies(tiny: TinyTTS, cadence_s: float) -> tuple[TTSFrameModel, list[str], list[float]]:
    """Row 0 speaks 2 frames ahead (clock at 0), row 1 is through its audio delay (its first
    audio is due), row 2 has just begun. Returns the model, the step kinds from here on and the
    clock to move."""
    now = [0.0]
    kinds: list[str] = []
    frame_model = TTSFrameModel(
        engine(tiny, 3, cfg_coef=2.0),
        catch_up_lead_s=0.16,
        full_step_cadence_s=cadence_s,
        clock=lambda: now[0],
        on_step=kinds.append,
    )
    model = frame_model.model
    splitter = ScriptSplitter(model.tokenizer, speaker_token=model.ids.main, frame_rate=model.frame_rate)
    for slot, voice in ((0, "alice"), (1, "bob"), (2, "alice")):
        frame_model.begin(slot, model.resolve_voice(voice), None)
        frame_model.push(slot, splitter.split(TEXT))
        frame_model.end(slot)
        only = np.arange(3) == slot
        if slot == 0:
            made = 0
            while made < 2:
                output = frame_model.step(np.zeros((3, 1920), np.float32), only)[0]
                made += output is not None and output.audio.size > 0
        elif slot == 1:
            for _ in range(model.young_steps):
                frame_model.step(np.zeros((3, 1920), np.float32), only)
    assert model.young_rows().tolist() == [False, False, True]
    kinds.clear()
    return frame_model, kinds, now


def test_with_a_cadence_a_first_audio_waits_for_the_next_full_step_while_new_replies_go_on(tiny_tts: TinyTTS) -> None:
    live, silence = np.ones(3, bool), np.zeros((3, 1920), np.float32)
    frame_model, kinds, _ = _three_replies(tiny_tts, cadence_s=0.0)
    frame_model.step(silence, live)
    assert kinds == ["full_first_audio_due"]  # no cadence: row 1's first audio costs row 2 a full step now

    frame_model, kinds, now = _three_replies(tiny_tts, cadence_s=0.06)
    outputs = frame_model.step(silence, live)
    # Within 60 ms of row 0's last full step row 1 waits; row 2 catches up alone.
    assert kinds == ["pre_audio"] and outputs[1] is None and outputs[2] is not None
    now[0] = 0.07  # the cadence has passed: one full step makes row 1's first audio
    outputs = frame_model.step(silence, live)
    assert kinds[-1] == "full_first_audio_due"
    assert outputs[1] is not None and outputs[1].audio.size
    now[0] = 0.09  # 20 ms later row 1 has 60 ms in hand, under half the lead: it steps at once
    frame_model.step(silence, live)
    assert kinds[-1] == "full_lead_short"


def test_a_seeded_stream_says_the_same_whenever_its_words_arrive(tiny_tts: TinyTTS) -> None:
    """A row waiting for words keeps its random stream while the others step: sampled, a seeded
    reply's audio does not depend on its text's timing or on the other streams."""
    at_once, trickled = sampled_model(tiny_tts), sampled_model(tiny_tts)
    start(at_once, 1, "bob", seed=5)
    start(trickled, 0, "alice", seed=9)  # another stream, stepping all along
    trickled.open_slot(1, trickled.resolve_voice("bob"), 5)
    splitter = ScriptSplitter(trickled.tokenizer, speaker_token=trickled.ids.main, frame_rate=trickled.frame_rate)
    words = splitter.split(TEXT)
    heard: dict[str, list[np.ndarray]] = {"at once": [], "trickled": []}
    waited = 0
    for step in range(120):
        if step % 6 == 0 and words:  # a word every 6 steps: row 1 waits for text in between
            word = words.pop(0)
            trickled.push_word(1, list(word.tokens), word.padding)
            if not words:
                trickled.end_of_stream(1)
        for name, model in (("at once", at_once), ("trickled", trickled)):
            frame = model.step()[1]
            assert frame is not None
            waited += name == "trickled" and not frame.stepped
            if frame.audio is not None:
                heard[name].append(frame.audio)
    assert waited > 10 and len(heard["trickled"]) > 10
    for ours, theirs in zip(heard["trickled"], heard["at once"], strict=False):
        np.testing.assert_array_equal(ours, theirs)


def test_first_audio_after_text_counts_from_the_word_a_waiting_reply_stepped_on_with(tiny_tts: TinyTTS) -> None:
    """``rtserve_kyutai_tts_first_audio_after_text_seconds``: the engine's share of first audio
    starts at the text the reply last waited for, not at its first word."""
    now = [0.0]
    after_text: list[float] = []
    frame_model = TTSFrameModel(
        engine(tiny_tts, 2, cfg_coef=2.0), clock=lambda: now[0], on_first_audio_after_text=after_text.append
    )
    model = frame_model.model
    splitter = ScriptSplitter(model.tokenizer, speaker_token=model.ids.main, frame_rate=model.frame_rate)
    words = splitter.split(TEXT)
    only_0 = np.array([True, False])
    frame_model.begin(0, model.resolve_voice("alice"), None)
    frame_model.push(0, words[:2])  # two words: its first pads (forced) step, then it waits for a third
    forced = 0
    while frame_model.ready_rows()[0]:
        frame_model.step(NO_INPUT, only_0)
        forced += 1
    assert forced == model.machine.settings.initial_padding
    now[0] = 1.0
    frame_model.push(0, words[2:3])  # the third: the row steps on with it
    assert frame_model.ready_rows()[0]
    now[0] = 3.0
    frame_model.push(0, words[3:])  # more text, not waited for
    frame_model.end(0)
    first = None
    while first is None:
        now[0] += 0.01
        output = frame_model.step(NO_INPUT, only_0)[0]
        first = output if output is not None and output.audio.size else None
    assert after_text == [pytest.approx(now[0] - 1.0)]  # from the third word, not the first or the last

    # A reply whose whole text came at once waited for nothing after it: counted from there.
    frame_model.begin(1, model.resolve_voice("bob"), None)
    start_at = now[0]
    frame_model.push(1, words)
    frame_model.end(1)
    while len(after_text) < 2:
        now[0] += 0.01
        frame_model.step(NO_INPUT, np.array([False, True]))
    assert after_text[1] == pytest.approx(now[0] - start_at)
