"""Whether a TTS row may step is read on the host (``TextMachine.ready_host``), with no device
read: it must agree with the device's own ``ready`` (what the step executes on) after any
sequence of pushes, ends, steps and reopened rows, and on the real model through its steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rtserve.engines.kyutai_tts.machine import MachineSettings, TextMachine, TokenIds
from rtserve.engines.kyutai_tts.script import ScriptSplitter
from tests.engines.kyutai_tts.test_pre_audio_steps import TEXT, sampled_model
from tests.engines.kyutai_tts.tiny import TinyTTS

ROWS = 4


def _device_ready(machine: TextMachine) -> list[bool]:
    ready: list[bool] = machine.ready().cpu().tolist()
    return ready


@pytest.mark.parametrize("ahead", [0, 2])
def test_host_and_device_agree_on_which_rows_may_step(ahead: int) -> None:
    ids = TokenIds(card=40)
    machine = TextMachine(MachineSettings(ids, second_stream_ahead=ahead, max_words=6), ROWS, torch.device("cpu"))
    rng = np.random.default_rng(ahead)
    steps = torch.zeros(ROWS, dtype=torch.long)
    ready_seen: set[bool] = set()
    for _ in range(600):
        row, op = int(rng.integers(ROWS)), rng.random()
        if op < 0.4:
            tokens = [int(t) for t in rng.integers(4, 39, size=int(rng.integers(0, 4)))]  # 0 tokens: a pause
            try:
                machine.push(row, tokens, int(rng.integers(0, 3)))
            except ValueError:
                assert machine.pending(row) == machine.settings.max_words
        elif op < 0.45:
            machine.end(row)
        elif op < 0.5:  # the row starts a new stream, as a slot opening does
            machine.forget(row)
            machine.reset_rows(torch.arange(ROWS) == row)
        else:
            machine.flush()
            sampled = torch.from_numpy(rng.choice([ids.new_word, ids.pad, 7], size=ROWS))
            ready = machine.ready()
            tried = ~ready & ~machine.asks_word(sampled)  # a step without the words the model pads in
            execute = torch.from_numpy(rng.random(ROWS) < 0.7) & (ready | tried)
            pending = machine.count.clone()
            step = machine.step(sampled, steps, execute)
            # A tried step reads no pending word: none popped, the text not run out.
            assert not (step.consumed & tried).any() and (machine.count == pending).logical_or(~tried).all()
            assert not ((machine.end_step >= 0) & tried & execute & (machine.end_step == steps)).any()
            steps += execute.long()
            for popped in torch.nonzero(step.consumed).flatten().tolist():
                machine.popped(popped)
            machine.read_pops_none(np.arange(ROWS), machine.pops_none().numpy())  # each step's flags, read
        host = machine.ready_host().tolist()
        assert host == _device_ready(machine)
        ready_seen.update(host)
    assert ready_seen == {True, False}  # the sequence went through both answers


def test_the_models_host_readiness_follows_its_steps(tiny_tts: TinyTTS) -> None:
    model = sampled_model(tiny_tts, tried_steps=False)  # readiness alone: no row tries a step without its words
    splitter = ScriptSplitter(model.tokenizer, speaker_token=model.ids.main, frame_rate=model.frame_rate)
    words = splitter.split(TEXT)

    def agree() -> None:
        model.flush()
        assert model.ready().tolist() == (model.open & model.machine.ready()).tolist()

    model.open_slot(0, model.resolve_voice("alice"), 1)
    model.open_slot(1, model.resolve_voice("bob"), 2)
    agree()
    for index, word in enumerate(words):  # row 0 gets a word a step, row 1 all of them at once
        model.push_word(0, list(word.tokens), word.padding)
        if index == 0:
            for whole in words:
                model.push_word(1, list(whole.tokens), whole.padding)
            model.end_of_stream(1)
        agree()
        model.step()
        agree()
    model.end_of_stream(0)
    for _ in range(4):
        model.step()
        agree()
    model.release(1)
    model.open_slot(1, model.resolve_voice("alice"), 3)
    agree()
    # Row 0 runs its text out; reopened row 1 has no text, but its first pads are forced (they read none).
    assert model.ready().tolist() == [True, True]
    model.step()
    model.step()
    agree()
    assert model.ready().tolist() == [True, False]  # row 1's next step may pop a word it lacks
