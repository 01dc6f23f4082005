"""The registered-voice store: a voice is stored only once its config is sane and its model
spoke; names never leave the folder; bounds; what a restart finds. The model check itself
(Piper loading the upload) is injected here; ``tests/web/http/test_voices_piper.py`` runs the real one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rtserve.config import VoiceStoreConfig
from rtserve.engines.cascade.voices import VoiceStore, check_config
from rtserve.engines.errors import EngineError

CONFIG = {
    "audio": {"sample_rate": 22050},
    "espeak": {"voice": "en-us"},
    "num_symbols": 3,
    "num_speakers": 1,
    "phoneme_id_map": {"a": [1]},
    "inference": {"noise_scale": 0.667, "length_scale": 1, "noise_w": 0.8},
}


def speaks(_: Path) -> np.ndarray:
    return np.full(100, 0.1, np.float32)


def store(tmp_path: Path, **limits: int) -> VoiceStore:
    return VoiceStore(VoiceStoreConfig(dir=str(tmp_path / "voices"), **limits))


def add(voices: VoiceStore, name: str = "mine", config: dict | None = None, prove=speaks):
    return voices.add(name, b"model", json.dumps(config or CONFIG).encode(), reserved=frozenset({"joe"}), prove=prove)


def test_a_voice_that_speaks_is_stored_listed_and_found_again_after_a_restart(tmp_path):
    voices = store(tmp_path)
    stored = add(voices)
    assert stored.info.name == "mine" and stored.info.sample_rate == 22050 and not stored.info.builtin
    assert sorted(p.name for p in (tmp_path / "voices").iterdir()) == ["mine.onnx", "mine.onnx.json"]
    assert [v.name for v in store(tmp_path).list()] == ["mine"]
    voices.remove("mine")
    assert list((tmp_path / "voices").iterdir()) == [] and voices.list() == []


@pytest.mark.parametrize(
    "prove",
    [
        lambda _: np.zeros(100, np.float32),
        lambda _: np.array([np.nan], np.float32),
        lambda _: np.zeros(0, np.float32),
        lambda _: 1 / 0,
    ],
)
def test_a_model_that_fails_or_is_silent_leaves_nothing_behind(tmp_path, prove):
    voices = store(tmp_path)
    with pytest.raises(EngineError) as refused:
        add(voices, prove=prove)
    assert refused.value.code == "invalid_voice_model" and refused.value.param == "model"
    assert list((tmp_path / "voices").iterdir()) == [] and voices.list() == []


@pytest.mark.parametrize(
    "change",
    [
        {"audio": {"sample_rate": 100}},
        {"audio": {"sample_rate": 22050.5}},
        {"num_symbols": 0},
        {"phoneme_id_map": {}},
        {"inference": {"length_scale": 0}},
        {"inference": {"noise_scale": 99}},
        {"espeak": None},
    ],
)
def test_insane_configs_are_refused(change):
    with pytest.raises(EngineError) as refused:
        check_config(json.dumps({**CONFIG, **change}).encode())
    assert refused.value.code == "invalid_voice_model" and refused.value.param == "config"


@pytest.mark.parametrize("raw", [b"{", b"[]", b'{"audio": {}}'])
def test_configs_that_are_not_piper_configs_are_refused(raw):
    with pytest.raises(EngineError) as refused:
        check_config(raw)
    assert refused.value.param == "config"


@pytest.mark.parametrize("name", ["../up", "a/b", ".x", "..", "x" * 65, "a..b", "v.onnx", "-x"])
def test_names_that_could_leave_the_folder_are_refused(tmp_path, name):
    with pytest.raises(EngineError) as refused:
        add(store(tmp_path), name)
    assert refused.value.code == "invalid_value" and refused.value.param == "name"
    assert not (tmp_path / "voices").exists() or list((tmp_path / "voices").iterdir()) == []


def test_bounds_and_name_clashes(tmp_path):
    voices = store(tmp_path, max_voices=1, max_model_bytes=1024)
    for name, code in [("joe", "voice_exists")]:
        with pytest.raises(EngineError) as refused:
            add(voices, name)
        assert refused.value.code == code
    add(voices, "first")
    for name, code in [("first", "voice_exists"), ("second", "voice_limit_exceeded")]:
        with pytest.raises(EngineError) as refused:
            add(voices, name)
        assert refused.value.code == code
    with pytest.raises(EngineError) as too_big:
        voices.add("big", b"x" * 2048, b"{}", reserved=frozenset(), prove=speaks)
    assert too_big.value.code == "request_too_large"
    with pytest.raises(EngineError) as unknown:
        voices.remove("nobody")
    assert unknown.value.code == "voice_not_found"
