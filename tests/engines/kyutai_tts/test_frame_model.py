"""``TTSFrameModel``, the TTS model as the lockstep runtime drives it
(docs/engines.md#kyutai-tts-on-the-lockstep-runtime): a row short of its text steps only what pops
no word, and with no row ready the model does not run; outputs only for
rows that stepped, with running totals; the audio the same as the model's own, frame for frame;
a row's word backlog refused past its bound with a typed error."""

from __future__ import annotations

import numpy as np
import pytest

from rtserve.engines.errors import EngineError
from rtserve.engines.kyutai_tts.frame_model import TTSFrameModel
from rtserve.engines.kyutai_tts.script import ScriptSplitter, Word
from rtserve.errors import INPUT_BACKPRESSURE
from tests.engines.kyutai_tts.test_tts_parity import engine
from tests.engines.kyutai_tts.tiny import TinyTTS

TEXT = "the quick brown fox jumps over the lazy dog"
NO_INPUT = np.zeros((2, 1920), np.float32)
LIVE = np.ones(2, bool)


def _words(model: TTSFrameModel, text: str) -> list[Word]:
    tts = model.model
    return ScriptSplitter(tts.tokenizer, speaker_token=tts.ids.main, frame_rate=tts.frame_rate).split(text)


def test_a_row_short_of_its_lookahead_steps_only_what_pops_no_word_then_the_model_does_not_run(
    tiny_tts: TinyTTS, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = TTSFrameModel(engine(tiny_tts, 2, cfg_coef=2.0))
    model.begin(0, model.model.resolve_voice("alice"), None)
    model.push(0, _words(model, "the quick")[:1])  # one word: short of its lookahead
    forced = model.model.machine.settings.initial_padding
    assert forced > 0
    for step in range(1, forced + 1):  # the stream's first pads are forced: they read no word
        output = model.step(NO_INPUT, LIVE)
        assert output[1] is None and output[0] is not None and output[0].speech is not None
        assert output[0].speech.steps == step

    def no_step() -> None:
        raise AssertionError("the model stepped with no row ready")

    monkeypatch.setattr(model.model, "step", no_step)
    assert model.step(NO_INPUT, LIVE) == [None, None]  # the next step may pop the word: it waits
    monkeypatch.undo()
    model.push(0, _words(model, "brown fox"))  # its lookahead arrived: row 0 steps, alone
    output = model.step(NO_INPUT, LIVE)
    assert output[1] is None and output[0] is not None and output[0].speech is not None
    assert output[0].speech.steps == forced + 1


def test_outputs_carry_running_totals_and_the_models_own_audio(tiny_tts: TinyTTS) -> None:
    ours, direct = TTSFrameModel(engine(tiny_tts, 2, cfg_coef=2.0)), engine(tiny_tts, 2, cfg_coef=2.0)
    words = _words(ours, TEXT)
    ours.begin(1, ours.model.resolve_voice("bob"), None)
    ours.push(1, words)
    ours.end(1)
    direct.open_slot(1, direct.resolve_voice("bob"))
    for word in words:
        direct.push_word(1, list(word.tokens), word.padding)
    direct.end_of_stream(1)
    steps = started = 0
    for _ in range(400):
        output = ours.step(NO_INPUT, LIVE)
        reference = direct.step()[1]
        assert output[0] is None and reference is not None and reference.stepped
        frame = output[1]
        assert frame is not None and frame.speech is not None
        steps, started = steps + 1, started + reference.words_started
        assert (frame.speech.steps, frame.speech.words_started) == (steps, started)
        if reference.audio is None:
            assert frame.audio.size == 0
        else:
            np.testing.assert_array_equal(frame.audio, reference.audio)
        if frame.speech.done:
            break
    assert frame is not None and frame.speech is not None  # the loop ran: the last step's frame
    assert frame.speech.done and frame.speech.words_started == len(words)


def test_a_row_holds_at_most_max_words(tiny_tts: TinyTTS) -> None:
    model = TTSFrameModel(engine(tiny_tts, 2, cfg_coef=2.0))
    model.begin(0, model.model.resolve_voice("alice"), None)
    words = _words(model, " ".join(["fox"] * (model.max_words + 1)))
    model.push(0, words[: model.max_words])
    with pytest.raises(EngineError) as refused:
        model.push(0, words[model.max_words :])
    assert refused.value.code == INPUT_BACKPRESSURE


def test_words_of_a_stream_closed_before_any_step_do_not_reach_the_next_one_on_its_row(tiny_tts: TinyTTS) -> None:
    """Pushed words reach the device just before the next step; a row reopened meanwhile speaks
    only its new stream's words, exactly as a row that never held the old ones."""
    reused, fresh = TTSFrameModel(engine(tiny_tts, 2, cfg_coef=2.0)), TTSFrameModel(engine(tiny_tts, 2, cfg_coef=2.0))
    reused.begin(0, reused.model.resolve_voice("alice"), 3)
    reused.push(0, _words(reused, "brown fox jumps over"))
    reused.release(0)
    words = _words(reused, TEXT)
    for model in (reused, fresh):
        model.begin(0, model.model.resolve_voice("bob"), 5)
        model.push(0, words)
        model.end(0)
    for _ in range(400):
        ours, theirs = reused.step(NO_INPUT, LIVE)[0], fresh.step(NO_INPUT, LIVE)[0]
        assert ours is not None and theirs is not None and ours.speech is not None and theirs.speech is not None
        assert ours.speech.words_started == theirs.speech.words_started
        np.testing.assert_array_equal(ours.audio, theirs.audio)
        if ours.speech.done:
            break
    assert ours is not None and ours.speech is not None  # the loop ran: the last step's output
    assert ours.speech.done and ours.speech.words_started == len(words)
