"""Rewrite a transformers wheel with only the model packages the in-process LLM imports (the
Llama family of SmolLM2, the auto classes and what they import), so that ``whlt`` fits one device
call beside ``whl`` and the voice agent's kit: 13.5 MB -> 2.2 MB for transformers 5.24.

Usage: python3 benchmarks/device/slim_transformers.py WHEEL (rewritten in place)."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

KEEP_MODELS = ("__init__.py", "auto", "llama", "encoder_decoder")  # auto's tokenizer mapping imports encoder_decoder


def kept(name: str) -> bool:
    parts = name.split("/")
    return not (len(parts) > 2 and parts[:2] == ["transformers", "models"] and parts[2] not in KEEP_MODELS)


def slim(wheel: Path) -> None:
    staging = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(staging, "w", zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            if not kept(info.filename):
                continue
            data = source.read(info)
            if info.filename.endswith(".dist-info/RECORD"):  # pip reads it: list only what the wheel holds
                rows = data.decode().splitlines()
                data = ("\n".join(row for row in rows if kept(row.split(",", 1)[0])) + "\n").encode()
            target.writestr(info, data)
    staging.replace(wheel)


if __name__ == "__main__":
    slim(Path(sys.argv[1]))
