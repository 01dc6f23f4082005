"""A cascade hearing with the streaming STT, speaking with the Kyutai TTS and answering with a vLLM
server (the GPU voice agent, docs/engines.md#cascade-streaming-asr) builds none of the embedded
CPU models: their paths are not even looked at, so a GPU host needs none of their packages. Whole
clips (transcriptions, chat and item audio) are then heard by the STT too, and it is the ASR
stage of sleep mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from rtserve.config import load_config
from rtserve.engines.cascade import CascadeEngine
from rtserve.engines.cascade.errors import ModelUnavailable
from rtserve.engines.kyutai_stt.clips import MODEL_NAME


def _overrides(tmp_path: Path, **cascade: str) -> dict[str, Any]:
    missing = str(tmp_path / "not-here")
    return {
        "models": {"asr": missing, "llm": missing, "tts": missing},
        "cascade": {"asr": "stt_engine", "tts": "tts_engine", "llm_engine": "vllm", **cascade},
        "stt_engine": {"weights": str(tmp_path)},
        "http": {"vllm": {"url": "http://127.0.0.1:9", "model": "served"}},  # never asked: nothing starts
    }


def test_streaming_models_need_none_of_the_embedded_ones(tmp_path: Path) -> None:
    engine = CascadeEngine(load_config(environ={}, overrides=_overrides(tmp_path)), CollectorRegistry())
    assert (engine.asr, engine.tts) == (None, None)
    lent = engine.turn_engines()
    assert lent.asr is not None and lent.asr.model_name == MODEL_NAME and lent.stt is engine.stt
    assert lent.asr.sample_rate == engine.capabilities.input_sample_rate == 24000
    assert MODEL_NAME in engine.model_ids() and "not-here" not in engine.model_ids()
    # Stage 1 is the STT; the Kyutai TTS becomes stage 3 once the engine set lends it (speak_with).
    assert [stage.stage for stage in engine.sleep_stages()] == ["vad", "stt_engine", "llm"]


@pytest.mark.parametrize(("key", "cascade"), [("asr", {"asr": "whisper"}), ("tts", {"tts": "piper"})])
def test_an_embedded_model_that_is_used_is_still_resolved(tmp_path: Path, key: str, cascade: dict[str, str]) -> None:
    config = load_config(environ={}, overrides=_overrides(tmp_path, **cascade))
    with pytest.raises(ModelUnavailable, match=f"models.{key}"):
        CascadeEngine(config, CollectorRegistry())
