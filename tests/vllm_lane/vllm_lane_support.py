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


async def vllm_metrics(server: VllmServer) -> dict[str, float]:
    """vLLM's Prometheus samples by name, summed over their labels."""
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/metrics") as response:
        text = await response.text()
    totals: dict[str, float] = {}
    for name, value in re.findall(r"^(vllm:[a-z_:]+)(?:\{[^}]*\})? ([0-9.e+-]+)$", text, re.M):
        totals[name] = totals.get(name, 0.0) + float(value)
    return totals


async def vllm_requests(server: VllmServer) -> float:
    """Requests vLLM finished (every finish reason)."""
    return (await vllm_metrics(server))["vllm:request_success_total"]
