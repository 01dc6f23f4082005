"""Model locations: wheel defaults, local overrides, and clear failures instead of downloads."""

from __future__ import annotations

from pathlib import Path

import pytest

from rtserve.config import ConfigError, ModelPaths, load_config
from rtserve.engines.cascade.errors import ModelUnavailable
from rtserve.engines.cascade.model_paths import resolve_asr, resolve_llm, resolve_tts, resolve_vad

RESOLVERS = {"asr": resolve_asr, "llm": resolve_llm, "tts": resolve_tts, "vad": resolve_vad}


@pytest.mark.models
def test_defaults_are_the_files_shipped_in_wheels() -> None:
    vad, asr, llm, tts = (resolve(ModelPaths()) for resolve in (resolve_vad, resolve_asr, resolve_llm, resolve_tts))
    assert vad.path is not None and vad.path.name == "silero_vad.onnx"
    assert asr.path is not None and (asr.path / "model.bin").is_file()
    assert llm.path is not None and llm.path.suffix == ".gguf"
    assert tts.path is not None and tts.path.name == "en_US-joe-medium.onnx"
    assert [m.model_id for m in (llm, asr, tts)] == [
        "smollm2-135m-instruct",
        "whisper-tiny.en",
        "piper-joe",
    ]


@pytest.mark.parametrize("key, resolve", RESOLVERS.items())
def test_a_hub_name_fails_naming_the_config_key(key: str, resolve, tmp_path: Path) -> None:
    with pytest.raises(ModelUnavailable) as raised:
        resolve(ModelPaths(**{key: "openai/whisper-tiny.en"}))
    message = str(raised.value)
    assert f"models.{key}" in message and f"RTSERVE_MODELS__{key.upper()}" in message
    assert "never downloads" in message
    assert raised.value.code == "model_unavailable"
    assert isinstance(raised.value, ConfigError)  # `rtserve serve` reports it as one line


def test_local_paths_of_the_wrong_shape_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "voice.onnx").write_bytes(b"")  # no voice.onnx.json beside it
    for key, value in (
        ("asr", tmp_path / "empty"),
        ("llm", tmp_path / "empty"),
        ("tts", tmp_path / "voice.onnx"),
        ("vad", tmp_path / "empty"),
    ):
        with pytest.raises(ModelUnavailable, match=f"models.{key}"):
            RESOLVERS[key](ModelPaths(**{key: str(value)}))


def test_local_overrides_are_used(tmp_path: Path) -> None:
    asr = tmp_path / "my-whisper"
    asr.mkdir()
    (asr / "model.bin").write_bytes(b"")
    (asr / "tokenizer.json").write_text("{}")
    llm = tmp_path / "MyModel"
    llm.mkdir()
    (llm / "config.json").write_text("{}")
    assert resolve_asr(ModelPaths(asr=str(asr))).model_id == "my-whisper"
    assert resolve_llm(ModelPaths(llm=str(llm))).path == llm


def test_paths_come_from_the_environment() -> None:
    config = load_config(environ={"RTSERVE_MODELS__ASR": "/models/whisper", "RTSERVE_MODELS__CPU_THREADS": "1"})
    assert config.models.asr == "/models/whisper" and config.models.cpu_threads == 1
