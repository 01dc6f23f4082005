"""What the vLLM lane's tests share: the running server's address, and what vLLM says it served."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import aiohttp


@dataclass(frozen=True)
class VllmServer:
    url: str  # http://127.0.0.1:PORT
    model: str  # its --served-model-name
    log: Path


async def vllm_requests(server: VllmServer) -> float:
    """Requests vLLM finished (its Prometheus counter, summed over finish reasons)."""
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/metrics") as response:
        text = await response.text()
    return sum(float(m) for m in re.findall(r"^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$", text, re.M))
