"""``moshi_engine.weights`` as a hub repo id, without the network: the tiny checkpoint in a hub
cache written in huggingface_hub's layout (offline), or behind a local hub server
(``HF_ENDPOINT``): served on ``/api/chat``, downloaded with progress and a resume, and every
failure one line at startup (exit 2)."""

from __future__ import annotations

import asyncio
import errno
import io
import os
import socket
import sys
import tarfile
import time
from pathlib import Path

import aiohttp
import huggingface_hub
import numpy as np
import pytest
from huggingface_hub.file_download import DryRunFileInfo
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig, WeightsConfig
from rtserve.engines.moshi.weights import resolve
from rtserve.engines.registry import create_engine
from rtserve.weights import WeightsError, hub
from rtserve.weights.source import HubRepo, WeightSource
from tests.engines.moshi.tiny import TinyCheckpoint
from tests.web.moshi_support import FRAME, MoshiClient, moshi_server, noise_signal
from tests.weights.hub_support import COMMIT, FakeHub, FakeRepo, folder_files, serve_hub, write_cache

REPO = "kyutai/tiny-moshi"
SUBPROCESS_S = 180


def _voices_tgz(extra_bytes: int = 0) -> bytes:
    """PersonaPlex's voice prompt archive; ``extra_bytes`` of noise make it big enough that
    huggingface_hub's 10 MiB read chunks can resume it part way."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz", compresslevel=1) as tar:
        for name, body in (
            ("voices/NATF2.pt", b"voic"),
            ("voices/NATM1.pt", b"voic"),
            ("voices/noise.bin", np.random.default_rng(0).bytes(extra_bytes)),
        ):
            member = tarfile.TarInfo(name)
            member.size = len(body)
            tar.addfile(member, io.BytesIO(body))
    return data.getvalue()


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RTSERVE_", "HF_", "HUGGING"))}
    env.update(
        HF_HOME=str(tmp_path / "hf-home"),  # no token file of this machine's user
        HF_HUB_CACHE=str(tmp_path / "hub"),
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        RTSERVE_WEIGHTS__PROGRESS_INTERVAL_S="0.05",
    )
    env.update(extra)
    return env


async def _rtserve(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rtserve.cli",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), SUBPROCESS_S)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def _one_line_failure(code: int, err: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


async def test_serve_from_the_hub_cache_offline_answers_api_chat(
    tiny: TinyCheckpoint, moshi_config: ServerConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = write_cache(tmp_path / "hub", REPO, {**folder_files(tiny.folder), "voices.tgz": _voices_tgz()})
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    config = moshi_config.model_copy(
        update={"moshi_engine": moshi_config.moshi_engine.model_copy(update={"weights": f"hf://{REPO}"})}
    )
    registry = CollectorRegistry()
    engine = create_engine("moshi", config, registry)
    async with moshi_server(config, engine, registry) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url("/api/chat") + "?seed=3") as ws:
            client = MoshiClient(ws)
            await client.handshake()
            await client.send_pcm(noise_signal(10, seed=4))
            audio = await client.receive_audio(6 * FRAME)
    assert float(np.sqrt(np.mean(audio[4 * FRAME :] ** 2))) > 1e-4
    # PersonaPlex's voice prompts: unpacked once beside the archive, in the snapshot folder.
    assert (snapshot / "voices" / "NATF2.pt").read_bytes() == b"voic"
    assert (snapshot / "voices.tgz").is_symlink()  # the snapshot itself is left as huggingface_hub wrote it


def test_names_in_another_repo_resolve_from_the_cache(
    tiny: TinyCheckpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = folder_files(tiny.folder)
    mimi = files.pop("mimi.safetensors")
    config = files["config.json"].decode().replace('"mimi.safetensors"', '"hf://kyutai/shared-mimi@v1/m.safetensors"')
    write_cache(tmp_path / "hub", REPO, {**files, "config.json": config.encode()})
    write_cache(tmp_path / "hub", "kyutai/shared-mimi", {"m.safetensors": mimi}, commit="f" * 40)
    (tmp_path / "hub" / "models--kyutai--shared-mimi" / "refs" / "v1").write_text("f" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    source = WeightSource(HubRepo(REPO), "moshi_engine.weights", progress_interval_s=1.0)
    resolved = resolve(source, WeightsConfig())
    assert resolved.weights is not None
    assert resolved.weights["mimi_name"].read_bytes() == mimi
    assert resolved.weights["mimi_name"].parent.name == "f" * 40
    assert source.local_root == tmp_path / "hub" / "models--kyutai--tiny-moshi" / "snapshots" / COMMIT


async def test_download_prints_the_snapshot_with_progress_and_resumes_a_cut_transfer(
    tiny: TinyCheckpoint, tmp_path: Path
) -> None:
    files = {**folder_files(tiny.folder), "voices.tgz": _voices_tgz(21 * 2**20)}
    cut = 15 * 2**20  # past huggingface_hub's first 10 MiB read chunk: it resumes from there
    fake = FakeHub({REPO: FakeRepo(files)}, chunk=2**20, chunk_delay_s=0.03, cut_first_get_at=cut)
    async with serve_hub(fake) as endpoint:
        code, out, err = await _rtserve("download", REPO, env=_env(tmp_path, HF_ENDPOINT=endpoint))
    assert code == 0, err
    snapshot = tmp_path / "hub" / "models--kyutai--tiny-moshi" / "snapshots" / COMMIT
    assert out.strip().splitlines()[-1] == str(snapshot)
    read = {"config.json", "mimi_config.json", "model.safetensors", "mimi.safetensors", "tokenizer.model", "voices.tgz"}
    for name in read:
        assert (snapshot / name).read_bytes() == files[name], name
        assert (snapshot / name).is_symlink()
    # Only what the engine reads (not tokenizer.vocab), and the voices unpacked beside them.
    assert {p.name for p in snapshot.iterdir()} == read | {"voices"}
    assert (snapshot / "voices" / "NATF2.pt").read_bytes() == b"voic"
    # The cut transfer went on from where it stopped, with a Range request.
    resumed = [r for m, p, r in fake.requests if m == "GET" and p == f"{REPO}/voices.tgz" and r]
    assert resumed == [f"bytes={10 * 2**20}-"]
    progress = [line for line in err.splitlines() if "downloading hf://kyutai/tiny-moshi:" in line and "%" in line]
    assert progress, err
    assert "/s" in progress[-1] and " of " in progress[-1]
    assert f"downloaded hf://{REPO}" in err
    # Fetched once: offline, the same command answers from the cache.
    code, out, err = await _rtserve("download", f"hf://{REPO}", env=_env(tmp_path, HF_HUB_OFFLINE="1"))
    assert code == 0, err
    assert out.strip().splitlines()[-1] == str(snapshot)


async def test_serve_says_downloading_on_health_then_serves(tiny: TinyCheckpoint, tmp_path: Path) -> None:
    """Across the engine link (--workers 2): the engine process downloads, the worker's /health
    says 'downloading' with the fraction done, then 'ok'."""
    fake = FakeHub({REPO: FakeRepo(folder_files(tiny.folder))}, chunk=4 * 1024, chunk_delay_s=0.01)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with serve_hub(fake) as endpoint:
        args = ("serve", "--engine", "moshi", "--weights", REPO, "--workers", "2", "--port", str(port))
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rtserve.cli",
            *args,
            env=_env(tmp_path, HF_ENDPOINT=endpoint),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        seen: list[dict[str, object]] = []
        try:
            async with aiohttp.ClientSession() as http:
                deadline = time.monotonic() + SUBPROCESS_S
                while not seen or seen[-1]["status"] != "ok":
                    assert time.monotonic() < deadline, seen[-3:]
                    assert process.returncode is None, "the server exited"
                    try:
                        async with http.get(f"http://127.0.0.1:{port}/health") as response:
                            seen.append(await response.json())
                    except aiohttp.ClientConnectionError:
                        pass
                    await asyncio.sleep(0.05)
        finally:
            process.terminate()
            _, err = await asyncio.wait_for(process.communicate(), SUBPROCESS_S)
    downloading = [s for s in seen if s["status"] == "downloading"]
    assert downloading, seen
    fractions = [float(str(s["fraction"])) for s in downloading]
    assert fractions == sorted(fractions) and fractions[0] >= 0 and fractions[-1] <= 1
    assert all(int(str(s["bytes_total"])) > 0 for s in downloading)
    assert "downloading hf://kyutai/tiny-moshi:" in err.decode()


@pytest.mark.parametrize(
    ("token", "status"),
    [(None, "401"), ("hf_wrong", "403")],
)
async def test_a_gated_repo_without_access_names_hf_token(
    tiny: TinyCheckpoint, tmp_path: Path, token: str | None, status: str
) -> None:
    fake = FakeHub({REPO: FakeRepo(folder_files(tiny.folder), token="hf_right")})
    extra = {} if token is None else {"HF_TOKEN": token}
    async with serve_hub(fake) as endpoint:
        code, _, err = await _rtserve("download", REPO, env=_env(tmp_path, HF_ENDPOINT=endpoint, **extra))
        line = _one_line_failure(code, err)
        assert "gated" in line and "HF_TOKEN" in line and REPO in line
        assert any(m == "HEAD" for m, _, _ in fake.requests)
        assert not any(m == "GET" for m, _, _ in fake.requests)  # refused before any download
        code, _, err = await _rtserve("download", REPO, env=_env(tmp_path, HF_ENDPOINT=endpoint, HF_TOKEN="hf_right"))
    assert code == 0, err


async def test_a_file_missing_from_the_repo_is_named(tiny: TinyCheckpoint, tmp_path: Path) -> None:
    files = folder_files(tiny.folder)
    del files["tokenizer.model"]
    fake = FakeHub({REPO: FakeRepo(files)})
    async with serve_hub(fake) as endpoint:
        code, _, err = await _rtserve("download", REPO, env=_env(tmp_path, HF_ENDPOINT=endpoint))
    line = _one_line_failure(code, err)
    assert "has no file 'tokenizer.model'" in line and "config.json tokenizer_name" in line
    assert not any(m == "GET" and "model.safetensors" in p for m, p, _ in fake.requests)


@pytest.mark.parametrize("workers", [1, 2])
async def test_serve_offline_without_the_repo_in_the_cache_exits_2_with_one_line(tmp_path: Path, workers: int) -> None:
    args = ("serve", "--engine", "moshi", "--weights", f"hf://{REPO}", "--workers", str(workers), "--port", "0")
    code, _, err = await _rtserve(*args, "--log-level", "error", env=_env(tmp_path, HF_HUB_OFFLINE="1"))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "'moshi_engine.weights'" in lines[0] and f"hf://{REPO}" in lines[0] and "HF_HUB_OFFLINE" in lines[0]
    assert str(tmp_path / "hub") in lines[0]


def test_disk_full_while_downloading_names_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC from huggingface_hub's download (the boundary: ``hf_hub_download``)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    def full_disk(repo_id: str, filename: str, *, dry_run: bool = False, **_: object) -> object:
        if dry_run:
            return DryRunFileInfo(COMMIT, 10, filename, str(tmp_path / filename), False, True)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(hub, "hf_hub_download", full_disk)
    source = WeightSource(HubRepo(REPO), "moshi_engine.weights", progress_interval_s=1.0)
    with pytest.raises(WeightsError, match=r"disk full while downloading model.safetensors into the hub cache") as info:
        source.file("model.safetensors", "the LM")
    assert str(tmp_path / "hub") in str(info.value)
