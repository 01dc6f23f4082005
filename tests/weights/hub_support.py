"""A hub without the network: a cache written in huggingface_hub's on-disk layout, and a small
aiohttp server on 127.0.0.1 answering the two calls ``hf_hub_download`` makes (``HEAD`` and
``GET`` of ``/ORG/NAME/resolve/REVISION/PATH``) the way the hub does: ``ETag``,
``X-Repo-Commit``, ``Content-Length``, ``Range``, and ``X-Error-Code`` on refusals; and the
file list ``list_repo_files`` reads (``/api/models/ORG/NAME/tree/REVISION``)."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def folder_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def write_cache(cache: Path, repo_id: str, files: dict[str, bytes], *, commit: str = COMMIT) -> Path:
    """``models--ORG--NAME`` with ``blobs/<sha256>``, ``snapshots/<commit>/<name>`` as relative
    symlinks into ``blobs/`` and ``refs/main``, as huggingface_hub writes them. Returns the snapshot."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        pointer = snapshot / name
        pointer.parent.mkdir(parents=True, exist_ok=True)
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    return snapshot


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    token: str | None = None  # gated: only this bearer token gets in (401 without, 403 with another)
    commit: str = COMMIT


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo]
    chunk: int = 64 * 1024
    chunk_delay_s: float = 0.0  # a slow link, for progress lines and /health 'downloading'
    cut_first_get_at: int | None = None  # the first GET of each file stops after this many bytes
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, Range
    _cut: set[str] = field(default_factory=set)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{org}/{name}/resolve/{revision}/{path:.+}", self._resolve)
        app.router.add_get("/api/models/{org}/{name}/tree/{revision}", self._tree)
        return app

    async def _tree(self, request: web.Request) -> web.Response:
        """``list_repo_files``: every file of the repo, one page."""
        repo = self.repos.get(f"{request.match_info['org']}/{request.match_info['name']}")
        if repo is None:
            return _refuse(401, "RepoNotFound", "Repository not found")
        files = [
            {"type": "file", "path": path, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
            for path, data in sorted(repo.files.items())
        ]
        return web.json_response(files)

    async def _resolve(self, request: web.Request) -> web.StreamResponse:
        repo_id = f"{request.match_info['org']}/{request.match_info['name']}"
        path = request.match_info["path"]
        self.requests.append((request.method, f"{repo_id}/{path}", request.headers.get("Range")))
        repo = self.repos.get(repo_id)
        if repo is None:
            return _refuse(401, "RepoNotFound", "Repository not found")
        if repo.token is not None:
            sent = request.headers.get("Authorization", "")
            if sent != f"Bearer {repo.token}":
                status = 403 if sent else 401
                return _refuse(status, "GatedRepo", "Access to this gated repo is restricted")
        data = repo.files.get(path)
        if data is None:
            return _refuse(404, "EntryNotFound", "Entry not found", commit=repo.commit)
        headers = {
            "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
            "X-Repo-Commit": repo.commit,
            "Accept-Ranges": "bytes",
        }
        if request.method == "HEAD":
            return web.Response(headers={**headers, "Content-Length": str(len(data))})
        start = 0
        ranged = request.headers.get("Range")
        if ranged is not None:
            start = int(ranged.removeprefix("bytes=").split("-")[0])
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        response = web.StreamResponse(status=206 if ranged else 200, headers=headers)
        response.content_length = len(data) - start
        await response.prepare(request)
        cut = self.cut_first_get_at if path not in self._cut else None
        self._cut.add(path)
        for offset in range(start, len(data), self.chunk):
            end = min(len(data), offset + self.chunk)
            if cut is not None and end > cut:
                await response.write(data[offset:cut])
                assert request.transport is not None
                request.transport.abort()  # the connection drops mid-file
                return response
            await response.write(data[offset:end])
            if self.chunk_delay_s:
                await asyncio.sleep(self.chunk_delay_s)
        await response.write_eof()
        return response


def _refuse(status: int, code: str, message: str, *, commit: str | None = None) -> web.Response:
    headers = {"X-Error-Code": code, "X-Error-Message": message}
    if commit is not None:
        headers["X-Repo-Commit"] = commit
    return web.json_response({"error": message}, status=status, headers=headers)


@asynccontextmanager
async def serve_hub(hub: FakeHub) -> AsyncIterator[str]:
    """The hub's endpoint URL (for ``HF_ENDPOINT``)."""
    runner = web.AppRunner(hub.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
