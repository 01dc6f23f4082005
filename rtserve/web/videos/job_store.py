"""Video jobs that outlive the process: rows in SQLite (through ``aiosqlite``), MP4 files beside it.

``/v1/videos`` is asynchronous (docs/serving.md#videos): a job is created ``queued``, becomes
``in_progress`` when its generation starts, and ends ``completed`` (its MP4 downloadable until
deleted or ``expires_at``) or ``failed`` (with an error). Everything a client can read back is
in the database file, so a restarted server still lists, serves and deletes earlier jobs; a job
the restart interrupted is marked failed, since its generation state died with the process (a job
records the process running it: ``--workers N`` share the store, and one worker starting leaves
the jobs of the others alone).

Bounds (``videos`` config): rows at most ``max_jobs`` (finished jobs are dropped oldest first to
make room; when every row is still running a new job is refused), stored bytes at most
``max_store_bytes`` (oldest completed files dropped first), each finished job kept
``job_ttl_s``. A file is written under a temporary name and renamed, so a crash never leaves a
half file that looks complete.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rtserve.errors import JOB_INTERRUPTED, RESOURCE_EXHAUSTED, RtserveError

if TYPE_CHECKING:
    import aiosqlite  # the media extra; imported where the store opens, so servers without it start

JobStatus = Literal["queued", "in_progress", "completed", "failed"]
_ACTIVE = ("queued", "in_progress")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS video_jobs (
    id TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL,
    status TEXT NOT NULL,
    progress INTEGER NOT NULL DEFAULT 0,
    model TEXT NOT NULL,
    prompt TEXT NOT NULL,
    size TEXT NOT NULL,
    seconds TEXT NOT NULL,
    params TEXT NOT NULL,
    completed_at INTEGER,
    expires_at INTEGER,
    error TEXT,
    bytes INTEGER NOT NULL DEFAULT 0,
    owner INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS video_jobs_created ON video_jobs (created_at, id);
"""
_COLUMNS = (
    "id, created_at, status, progress, model, prompt, size, seconds, params, completed_at, expires_at, error, bytes"
)


@dataclass(frozen=True)
class StoreLimits:
    job_ttl_s: float
    max_jobs: int
    max_store_bytes: int


@dataclass(frozen=True)
class VideoJob:
    id: str
    created_at: int
    status: JobStatus
    progress: int
    model: str
    prompt: str
    size: str
    seconds: str
    params: dict[str, Any] = field(default_factory=dict)
    completed_at: int | None = None
    expires_at: int | None = None
    error: dict[str, Any] | None = None  # {"code", "message", "param"} once failed
    bytes: int = 0

    def public(self) -> dict[str, Any]:
        """The job as the OpenAI ``Video`` object (the SDK parses it)."""
        return {
            "id": self.id,
            "object": "video",
            "created_at": self.created_at,
            "status": self.status,
            "progress": self.progress,
            "model": self.model,
            "prompt": self.prompt,
            "size": self.size,
            "seconds": self.seconds,
            "completed_at": self.completed_at,
            "expires_at": self.expires_at,
            "error": self.error,
            "remixed_from_video_id": None,
            **self.params,
        }


def _job(row: aiosqlite.Row) -> VideoJob:
    return VideoJob(
        id=row[0],
        created_at=row[1],
        status=row[2],
        progress=row[3],
        model=row[4],
        prompt=row[5],
        size=row[6],
        seconds=row[7],
        params=json.loads(row[8]),
        completed_at=row[9],
        expires_at=row[10],
        error=json.loads(row[11]) if row[11] else None,
        bytes=row[12],
    )


class VideoJobStore:
    """The one owner of the jobs database and the video files (one per front-end process)."""

    def __init__(
        self, db: aiosqlite.Connection, folder: Path, limits: StoreLimits, now: Callable[[], float] = time.time
    ) -> None:
        self._db = db
        self.folder = folder
        self._limits = limits
        self._now = now
        self._lock = asyncio.Lock()  # admission and eviction decisions read then write

    @classmethod
    async def open(
        cls, folder: str | os.PathLike[str], limits: StoreLimits, now: Callable[[], float] = time.time
    ) -> VideoJobStore:
        import aiosqlite  # only a server with video routes opens the store

        path = Path(folder)
        await asyncio.to_thread(path.mkdir, parents=True, exist_ok=True)
        db = await aiosqlite.connect(path / "jobs.sqlite3")
        await db.execute("PRAGMA journal_mode=WAL")  # worker processes read while one writes
        await db.executescript(_SCHEMA)
        store = cls(db, path, limits, now)
        await store._recover()
        return store

    async def close(self) -> None:
        await self._db.close()

    def file(self, job_id: str) -> Path:
        return self.folder / f"{job_id}.mp4"

    async def _recover(self) -> None:
        """Jobs whose process is gone cannot resume: failed, their half-written files removed. Jobs
        another live process runs (``--workers N`` share the store) are left to it."""
        async with self._db.execute("SELECT id, owner FROM video_jobs WHERE status IN (?, ?)", _ACTIVE) as cursor:
            orphans = [job_id async for job_id, owner in cursor if owner == os.getpid() or not _alive(owner)]
        error = json.dumps(
            {"code": JOB_INTERRUPTED, "message": "The server restarted before this video was finished.", "param": None}
        )
        for job_id in orphans:
            await self._db.execute(
                "UPDATE video_jobs SET status = 'failed', error = ?, completed_at = ? WHERE id = ?",
                (error, int(self._now()), job_id),
            )
            await asyncio.to_thread((self.folder / f"{job_id}.mp4.part").unlink, missing_ok=True)
        await self._db.commit()

    async def create(
        self, *, model: str, prompt: str, size: str, seconds: str, params: dict[str, Any] | None = None
    ) -> VideoJob:
        """A new ``queued`` job; ``RtserveError(resource_exhausted)`` when every row is taken by running jobs."""
        async with self._lock:
            await self._sweep()
            count = await self._scalar("SELECT COUNT(*) FROM video_jobs")
            if count >= self._limits.max_jobs:
                await self._evict_finished(count - self._limits.max_jobs + 1)
                if await self._scalar("SELECT COUNT(*) FROM video_jobs") >= self._limits.max_jobs:
                    raise RtserveError(
                        f"Too many video jobs in progress (limit {self._limits.max_jobs}); retry later.",
                        code=RESOURCE_EXHAUSTED,
                    )
            job = VideoJob(
                id=f"video_{secrets.token_hex(12)}",
                created_at=int(self._now()),
                status="queued",
                progress=0,
                model=model,
                prompt=prompt,
                size=size,
                seconds=seconds,
                params=params or {},
            )
            values = (job.id, job.created_at, job.status, 0, model, prompt, size, seconds, json.dumps(job.params))
            await self._db.execute(
                f"INSERT INTO video_jobs ({_COLUMNS}, owner) VALUES ({', '.join('?' * 9)}, NULL, NULL, NULL, 0, ?)",
                (*values, os.getpid()),
            )
            await self._db.commit()
            return job

    async def get(self, job_id: str) -> VideoJob | None:
        async with self._db.execute(f"SELECT {_COLUMNS} FROM video_jobs WHERE id = ?", (job_id,)) as cursor:
            row = await cursor.fetchone()
        if row is None:
            return None
        job = _job(row)
        if job.expires_at is not None and job.expires_at <= self._now():
            await self.delete(job_id)  # expired between sweeps: gone already for the client
            return None
        return job

    async def list(
        self, *, after: str | None, limit: int, order: Literal["asc", "desc"]
    ) -> tuple[list[VideoJob], bool]:
        """One page, newest first for ``desc``; ``after`` is the last id of the previous page.
        Returns the page and whether more follow."""
        await self._sweep()
        op, direction = (">", "ASC") if order == "asc" else ("<", "DESC")
        where = ""
        args: tuple[Any, ...] = ()
        if after is not None:
            anchor = await self.get(after)
            if anchor is not None:
                where = f"WHERE (created_at, id) {op} (?, ?)"
                args = (anchor.created_at, anchor.id)
        query = f"SELECT {_COLUMNS} FROM video_jobs {where} ORDER BY created_at {direction}, id {direction} LIMIT ?"
        async with self._db.execute(query, (*args, limit + 1)) as cursor:
            rows = list(await cursor.fetchall())
        return [_job(r) for r in rows[:limit]], len(rows) > limit

    async def start(self, job_id: str) -> None:
        await self._update(job_id, "status = 'in_progress'", ())

    async def progress(self, job_id: str, percent: int) -> None:
        await self._update(job_id, "progress = ?", (max(0, min(99, percent)),))

    async def complete(self, job_id: str, mp4: bytes) -> None:
        """Store the video and mark the job done; older completed files make room when over the byte bound."""
        async with self._lock:
            if not await self._scalar("SELECT COUNT(*) FROM video_jobs WHERE id = ?", (job_id,)):
                return  # deleted while it was being generated: nothing to keep
            if len(mp4) > self._limits.max_store_bytes:
                await self._fail(job_id, RESOURCE_EXHAUSTED, "The video is larger than the store keeps.")
                return
            stored = await self._scalar("SELECT COALESCE(SUM(bytes), 0) FROM video_jobs")
            if stored + len(mp4) > self._limits.max_store_bytes:
                await self._evict_bytes(stored + len(mp4) - self._limits.max_store_bytes)
            part = self.folder / f"{job_id}.mp4.part"
            await asyncio.to_thread(_write, part, mp4)
            await asyncio.to_thread(os.replace, part, self.file(job_id))
            now = int(self._now())
            await self._update(
                job_id,
                "status = 'completed', progress = 100, completed_at = ?, expires_at = ?, bytes = ?",
                (now, now + int(self._limits.job_ttl_s), len(mp4)),
            )

    async def fail(self, job_id: str, code: str, message: str, param: str | None = None) -> None:
        async with self._lock:
            await self._fail(job_id, code, message, param)

    async def _fail(self, job_id: str, code: str, message: str, param: str | None = None) -> None:
        error = json.dumps({"code": code, "message": message, "param": param})
        now = int(self._now())
        await self._update(
            job_id,
            "status = 'failed', error = ?, completed_at = ?, expires_at = ?",
            (error, now, now + int(self._limits.job_ttl_s)),
        )

    async def delete(self, job_id: str) -> bool:
        cursor = await self._db.execute("DELETE FROM video_jobs WHERE id = ?", (job_id,))
        await self._db.commit()
        await asyncio.to_thread(self.file(job_id).unlink, missing_ok=True)
        return cursor.rowcount > 0

    async def sweep(self) -> None:
        """Drop expired jobs and their files (the app runs this every ``cleanup_interval_s``)."""
        async with self._lock:
            await self._sweep()

    async def _sweep(self) -> None:
        await self._delete_where("expires_at IS NOT NULL AND expires_at <= ?", (int(self._now()),))

    async def _evict_finished(self, count: int) -> None:
        await self._delete_where(
            "id IN (SELECT id FROM video_jobs WHERE status NOT IN (?, ?) ORDER BY created_at, id LIMIT ?)",
            (*_ACTIVE, count),
        )

    async def _evict_bytes(self, needed: int) -> None:
        freed, ids = 0, []
        async with self._db.execute(
            "SELECT id, bytes FROM video_jobs WHERE bytes > 0 ORDER BY created_at, id"
        ) as cursor:
            async for job_id, size in cursor:
                if freed >= needed:
                    break
                ids.append(job_id)
                freed += size
        for job_id in ids:
            await self.delete(job_id)

    async def _delete_where(self, condition: str, args: tuple[Any, ...]) -> None:
        async with self._db.execute(f"SELECT id FROM video_jobs WHERE {condition}", args) as cursor:
            ids = [row[0] async for row in cursor]
        for job_id in ids:
            await self.delete(job_id)

    async def _update(self, job_id: str, assignments: str, args: tuple[Any, ...]) -> None:
        await self._db.execute(f"UPDATE video_jobs SET {assignments} WHERE id = ?", (*args, job_id))
        await self._db.commit()

    async def _scalar(self, query: str, args: tuple[Any, ...] = ()) -> int:
        async with self._db.execute(query, args) as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row is not None else 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # no signal: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, as another user
    return pid > 0


def _write(path: Path, data: bytes) -> None:
    with path.open("wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
