"""Persona text and voice prompts are prefilled through the batched step; voices resolve
only inside the configured folder; the teacher-forced (PersonaPlex) layout forces the user."""

from __future__ import annotations

import json
import shutil
import wave
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from rtserve.engines.moshi.frame_model import MoshiFrameModel
from rtserve.engines.moshi.generator import TokenStream
from rtserve.engines.moshi.loader import LoadedModel, load_folder
from rtserve.engines.moshi.prompts import PromptError
from rtserve.engines.moshi.sampling import MoshiSampling, SlotSampler
from rtserve.engines.values import FrameOutput, SlotPrompt
from tests.engines.moshi.tiny import CARD, LM_KWARGS, reference_lm, stack_attention

FRAME = 1920
GREEDY = MoshiSampling(use_sampling=False)


def _audio(output: FrameOutput | None) -> np.ndarray:
    """A stepped live slot's audio (a live slot that was stepped has an output)."""
    assert output is not None
    return output.audio


def _drive(model: MoshiFrameModel, slot: int, steps: int) -> None:
    """What the scheduler does: prefill_step, then the batched step with the row not live."""
    live = np.zeros(model.batch_size, bool)
    silence = np.zeros((model.batch_size, FRAME), np.float32)
    for i in range(steps):
        done = model.prefill_step(slot)
        assert done == (i == steps - 1)
        model.step(silence, live)


def test_persona_text_prefills_one_token_per_step_and_changes_the_conversation(loaded: LoadedModel) -> None:
    model = MoshiFrameModel(loaded, 2, sampling=GREEDY)
    persona = "you are a helpful assistant"
    steps = model.open_slot(0, SlotPrompt(text=persona))
    assert model.tokenizer is not None
    expected = len(model.tokenizer.encode(f"<system> {persona} <system>"))
    assert steps == expected > 3
    assert model.open_slot(1, SlotPrompt()) == 0
    _drive(model, 0, steps)
    # The persona's tokens sit in slot 0's history: its text stream ended on the closing tag.
    tag = model.tokenizer.piece_to_id("<system>")
    last = model.stream.cache[0, 0, model.stream.offsets[0] % model.stream.ring].item()
    assert last == tag
    inputs = np.zeros((2, FRAME), np.float32)
    out0 = [model.step(inputs, np.ones(2, bool)) for _ in range(6)]
    plain = MoshiFrameModel(loaded, 1, sampling=GREEDY)
    plain.open_slot(0, SlotPrompt())
    for _ in range(steps):
        plain.step(inputs[:1], np.zeros(1, bool))  # same number of ticks, no persona
    out1 = [plain.step(inputs[:1], np.ones(1, bool)) for _ in range(6)]
    assert not np.array_equal(np.stack([_audio(o[0]) for o in out0]), np.stack([_audio(o[0]) for o in out1]))


def test_overlong_persona_is_refused_before_touching_state(loaded: LoadedModel) -> None:
    model = MoshiFrameModel(loaded, 1, sampling=GREEDY, max_prompt_tokens=4)
    with pytest.raises(PromptError, match="more than the 4 allowed"):
        model.open_slot(0, SlotPrompt(text="hello there how are you doing today"))


def test_voice_prompts_resolve_inside_the_folder_only(loaded: LoadedModel, tmp_path: Path) -> None:
    voices = tmp_path / "voices"
    voices.mkdir()
    torch.save(torch.randn(5, LM_KWARGS["dim"]), voices / "NATF0.pt")
    pcm = (0.2 * np.sin(np.arange(FRAME * 3) * 0.05) * 32767).astype(np.int16)
    with wave.open(str(voices / "talk.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes(pcm.tobytes())
    (tmp_path / "secret.pt").write_bytes(b"x")
    (voices / "link.pt").symlink_to(tmp_path / "secret.pt")
    model = MoshiFrameModel(loaded, 1, sampling=GREEDY, voice_dir=voices)
    assert model.open_slot(0, SlotPrompt(voice="NATF0")) == 5  # one step per embedding row
    _drive(model, 0, 5)
    # 3 audio frames + the acoustic delay's extra step.
    assert model.open_slot(0, SlotPrompt(voice=str(voices / "talk.wav"))) == 3 + 1
    _drive(model, 0, 4)
    for bad in ("../secret.pt", str(tmp_path / "secret.pt"), "link.pt"):
        with pytest.raises(PromptError, match="inside the voice folder"):
            model.open_slot(0, SlotPrompt(voice=bad))
    with pytest.raises(PromptError, match="unknown voice prompt"):
        model.open_slot(0, SlotPrompt(voice="NOPE"))
    torch.save(torch.randn(5, 7), voices / "wrong.pt")
    with pytest.raises(PromptError, match=r"expected \[steps, 32\]"):
        model.open_slot(0, SlotPrompt(voice="wrong.pt"))
    unconfigured = MoshiFrameModel(loaded, 1, sampling=GREEDY)
    with pytest.raises(PromptError, match="not configured"):
        unconfigured.open_slot(0, SlotPrompt(voice="NATF0"))


def test_teacher_forced_layout_forces_the_users_codebooks(weights: Path, tmp_path: Path) -> None:
    """PersonaPlex layout (dep_q = n_q): the depformer's user steps carry what the user said."""
    folder = tmp_path / "pp"
    shutil.copytree(weights, folder)
    kwargs = dict(LM_KWARGS, dep_q=16)
    lm = reference_lm(kwargs, seed=4)
    save_file(stack_attention(lm.state_dict()), str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, dep_q=16)))
    loaded = load_folder(folder, device=torch.device("cpu"), dtype=torch.float32)
    stream = TokenStream(loaded.lm, 2, SlotSampler(2, torch.device("cpu"), GREEDY))
    generator = torch.Generator().manual_seed(0)
    history = []
    for t in range(6):
        user = torch.randint(0, CARD, (2, 8), generator=generator)
        history.append(user)
        result = stream.step(user)
        if t == 0:
            assert not result.ready.any()
            continue
        # Output frame t-1 (delays undone): every user codebook is frame t-1's user code.
        assert torch.equal(result.tokens[:, 9:], history[t - 1]), f"frame {t}"
    model = MoshiFrameModel(loaded, 1, sampling=GREEDY)
    assert model.open_slot(0, SlotPrompt()) == 0
    out = model.step(np.zeros((1, FRAME), np.float32), np.ones(1, bool))
    assert out[0] is not None and out[0].audio.shape == (FRAME,)
