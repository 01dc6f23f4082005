"""Tried steps (docs/engines.md#tried-steps): a reply before its first audio that lacks the words
its next step may pop steps on while the model pads, stops where the model asks for a word (the
step put back, the model not run for it again until text comes), and says exactly what it says
with tried steps off, sampled."""

from __future__ import annotations

import numpy as np
import pytest

from rtserve.engines.kyutai_tts.model import KyutaiTTSModel
from rtserve.engines.kyutai_tts.script import ScriptSplitter, Word
from tests.engines.kyutai_tts.test_pre_audio_steps import DEVICES, TEXT, sampled_model
from tests.engines.kyutai_tts.tiny import TinyTTS


def _words(model: KyutaiTTSModel) -> list[Word]:
    return ScriptSplitter(model.tokenizer, speaker_token=model.ids.main, frame_rate=model.frame_rate).split(TEXT)


def _step_while_ready(model: KyutaiTTSModel) -> list[tuple[bool, np.ndarray | None]]:
    """Row 0's (stepped, codes) for each step while the host says it may step (bounded)."""
    frames: list[tuple[bool, np.ndarray | None]] = []
    for _ in range(40):
        if not model.ready()[0]:
            return frames
        frame = model.step()[0]
        assert frame is not None
        frames.append((frame.stepped, frame.codes))
    raise AssertionError("row 0 never stopped for text")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("checkpoint", ["tiny_tts", "tiny_tts_direct_cfg"])  # CFG distilled, or twin rows
def test_a_young_row_short_of_its_words_steps_on_while_the_model_pads_and_says_the_same(
    request: pytest.FixtureRequest, checkpoint: str, device: str
) -> None:
    tiny: TinyTTS = request.getfixturevalue(checkpoint)
    tried, waiting = sampled_model(tiny, device), sampled_model(tiny, device, tried_steps=False)
    assert tried.cfg_direct == (checkpoint == "tiny_tts_direct_cfg")
    words = _words(tried)
    ahead = tried.machine.settings.second_stream_ahead + 1  # a word is popped with this many in hand
    made: dict[str, list[np.ndarray]] = {"tried": [], "waiting": []}
    steps_before_text = {"tried": 0, "waiting": 0}
    for name, model in (("tried", tried), ("waiting", waiting)):
        model.open_slot(0, model.resolve_voice("alice"), 3)
        for word in words[:ahead]:  # the first word and its lookahead: the second word's pop lacks its own
            model.push_word(0, list(word.tokens), word.padding)
        frames = _step_while_ready(model)
        made[name] += [codes for _, codes in frames if codes is not None]
        steps_before_text[name] = int(model.steps[0])
        if name == "tried":
            # It stopped at its first audio, or where the model asked for the missing word (that try
            # put back) or must ask for it next: then the host holds the row until text comes.
            assert all(stepped for stepped, _ in frames[:-1])
            assert model.steps[0] == model.young_steps or model.machine.asked()[0]
        else:
            assert all(stepped for stepped, _ in frames)
        for word in words[ahead:]:
            model.push_word(0, list(word.tokens), word.padding)
            assert model.ready()[0]
        model.end_of_stream(0)
        for _ in range(len(words) * 12 + 40):
            frame = model.step()[0]
            assert frame is not None
            if frame.codes is not None:
                made[name].append(frame.codes)
            if frame.done:
                break
        else:
            raise AssertionError("the reply never ended")
    assert steps_before_text["tried"] > steps_before_text["waiting"]  # it went on before the text came
    assert steps_before_text["tried"] <= tried.young_steps  # tries stop at the first audio
    assert len(made["tried"]) == len(made["waiting"]) > 20
    for ours, theirs in zip(made["tried"], made["waiting"], strict=True):
        np.testing.assert_array_equal(ours, theirs)
