"""What ``bench_voice_agent.py`` needs on a GPU host that has none of the embedded CPU models (the
H200 host: no Whisper, SmolLM2, Piper or Silero packages, no registry, at most 64 MiB carried per
call), written here once into ``--kit`` (default ``benchmarks/results/voice_agent_kit``):

* ``question.wav``: the spoken question (Piper, read here);
* ``silero_vad.onnx``: the VAD's model file (``models.vad``; onnxruntime is on the host);
* ``whisper-random-tiny/``: a Whisper of a tiny shape with random weights in CTranslate2 format
  (8 MB; the multilingual tokenizer of the shipped model). The cascade loads Whisper at start
  even when sessions hear with the STT engine (``cascade.asr: stt_engine``), so the host needs
  one; nothing in the benchmark decodes with it;
* ``llm-unused/config.json`` and ``tts-unused.onnx`` (+ ``.json``): PLACEHOLDERS, never opened:
  ``models.llm`` and ``models.tts`` are resolved (must exist) although ``cascade.llm_engine:
  vllm`` and ``cascade.tts: tts_engine`` never load them;
* ``wheels/``: ctranslate2 and faster-whisper for CPython 3.12 (``pip download``), what Whisper
  runs on.

``env(kit)`` is the server's ``RTSERVE_MODELS__*`` settings that point at it.

    .venv/bin/python benchmarks/voice_agent_kit.py
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # for tests/ helpers; appended: an rtserve tree on PYTHONPATH stays first
KIT = ROOT / "benchmarks" / "results" / "voice_agent_kit"
WHEELS = ("ctranslate2==4.8.5", "faster-whisper==1.2.1")  # pyproject.toml's pins


def env(kit: Path) -> dict[str, str]:
    return {
        "RTSERVE_MODELS__VAD": str(kit / "silero_vad.onnx"),
        "RTSERVE_MODELS__ASR": str(kit / "whisper-random-tiny"),
        "RTSERVE_MODELS__LLM": str(kit / "llm-unused"),
        "RTSERVE_MODELS__TTS": str(kit / "tts-unused.onnx"),
    }


def write_whisper(target: Path) -> None:
    """Whisper of a tiny shape (1 layer each side, width 64), random weights, CTranslate2 int8."""
    import tempfile

    import torch
    from ctranslate2.converters import TransformersConverter

    # transformers 5: WhisperTokenizer is the fast (tokenizers) one; WhisperTokenizerFast is a run-time alias of it.
    from transformers import WhisperConfig, WhisperForConditionalGeneration, WhisperTokenizer

    from rtserve.config import ModelPaths
    from rtserve.engines.cascade.model_paths import resolve_asr

    shipped = resolve_asr(ModelPaths()).path
    assert shipped is not None
    tokenizer = WhisperTokenizer(tokenizer_file=str(shipped / "tokenizer.json"))
    start = tokenizer.convert_tokens_to_ids("<|startoftranscript|>")
    assert isinstance(start, int)  # one token in, one id out
    config = WhisperConfig(
        vocab_size=len(tokenizer),
        d_model=64,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        decoder_start_token_id=start,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        WhisperForConditionalGeneration(config).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        TransformersConverter(folder, copy_files=["tokenizer.json"]).convert(str(target), quantization="int8")


def write_kit(kit: Path) -> None:
    from bench_voice_agent import spoken_question  # benchmarks/ is on sys.path

    from rtserve.config import ModelPaths
    from rtserve.engines.cascade.model_paths import resolve_vad

    kit.mkdir(parents=True, exist_ok=True)
    spoken_question(kit / "question.wav")
    vad = resolve_vad(ModelPaths()).path
    assert vad is not None
    shutil.copy(vad, kit / "silero_vad.onnx")
    if not (kit / "whisper-random-tiny" / "model.bin").exists():
        write_whisper(kit / "whisper-random-tiny")
    placeholder = {"placeholder": "resolved by the cascade, never loaded (cascade.llm_engine vllm / tts tts_engine)"}
    (kit / "llm-unused").mkdir(exist_ok=True)
    (kit / "llm-unused" / "config.json").write_text(json.dumps(placeholder))
    (kit / "tts-unused.onnx").write_bytes(b"")
    (kit / "tts-unused.onnx.json").write_text(json.dumps(placeholder))
    for_host = ["--only-binary=:all:", "--python-version", "3.12", "--platform", "manylinux_2_28_x86_64"]
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *for_host]
    subprocess.run([*pip, "-d", str(kit / "wheels"), *WHEELS], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kit", type=Path, default=KIT)
    args = parser.parse_args()
    write_kit(args.kit)
    size = sum(p.stat().st_size for p in args.kit.rglob("*") if p.is_file())
    print(f"wrote {args.kit} ({size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
