"""The torch dtype each dtype setting names (``dtype``, ``codec_dtype``, ``decoder_dtype``, ...)."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
