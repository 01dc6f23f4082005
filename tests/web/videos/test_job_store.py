"""The SQLite job store: jobs and files survive reopening, bounds evict oldest finished first,
expired jobs and their files go, and a job a restart interrupted reads as failed."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

import pytest

from rtserve.errors import JOB_INTERRUPTED, RESOURCE_EXHAUSTED, RtserveError
from rtserve.web.videos.job_store import StoreLimits, VideoJobStore


class Now:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


LIMITS = StoreLimits(job_ttl_s=60, max_jobs=3, max_store_bytes=1000)


async def _job(store: VideoJobStore, prompt: str = "p") -> str:
    job = await store.create(model="m", prompt=prompt, size="64x64", seconds="1", params={"fps": 8})
    return job.id


async def test_jobs_and_files_survive_reopening(tmp_path: Path) -> None:
    now = Now()
    store = await VideoJobStore.open(tmp_path, LIMITS, now)
    done, running = await _job(store, "a"), await _job(store, "b")
    await store.start(done)
    await store.complete(done, b"mp4 bytes")
    await store.start(running)
    await store.progress(running, 40)
    await store.close()

    store = await VideoJobStore.open(tmp_path, LIMITS, now)
    job = await store.get(done)
    assert job is not None and job.status == "completed" and job.progress == 100 and job.completed_at is not None
    assert job.expires_at == job.completed_at + 60 and store.file(done).read_bytes() == b"mp4 bytes"
    assert job.public()["fps"] == 8
    cut = await store.get(running)
    assert cut is not None and cut.status == "failed" and cut.error is not None
    assert cut.error["code"] == JOB_INTERRUPTED
    await store.close()


async def test_reopening_leaves_jobs_of_live_processes(tmp_path: Path) -> None:
    """``--workers N`` share one store: a worker starting fails only the jobs of processes that are gone."""
    store = await VideoJobStore.open(tmp_path, LIMITS, Now())
    other, dead = await _job(store), await _job(store)
    await store.close()
    gone = await asyncio.create_subprocess_exec("true")
    await gone.wait()
    with sqlite3.connect(tmp_path / "jobs.sqlite3") as db:
        db.execute("UPDATE video_jobs SET owner = ? WHERE id = ?", (os.getppid(), other))
        db.execute("UPDATE video_jobs SET owner = ? WHERE id = ?", (gone.pid, dead))
    store = await VideoJobStore.open(tmp_path, LIMITS, Now())
    running, failed = await store.get(other), await store.get(dead)
    assert running is not None and running.status == "queued"
    assert failed is not None and failed.status == "failed"
    await store.close()


async def test_expired_jobs_and_files_are_dropped(tmp_path: Path) -> None:
    now = Now()
    store = await VideoJobStore.open(tmp_path, LIMITS, now)
    job_id = await _job(store)
    await store.complete(job_id, b"x" * 10)
    now.t += 61
    await store.sweep()
    assert await store.get(job_id) is None
    assert not store.file(job_id).exists()
    await store.close()


async def test_job_bound_evicts_finished_and_refuses_when_all_run(tmp_path: Path) -> None:
    store = await VideoJobStore.open(tmp_path, LIMITS, Now())
    first = await _job(store)
    await store.complete(first, b"x")
    await _job(store), await _job(store)
    await _job(store)  # the oldest finished job makes room
    assert await store.get(first) is None and not store.file(first).exists()
    with pytest.raises(RtserveError) as refused:
        await _job(store)  # every row is a running job
    assert refused.value.code == RESOURCE_EXHAUSTED
    await store.close()


async def test_byte_bound_drops_oldest_files(tmp_path: Path) -> None:
    store = await VideoJobStore.open(tmp_path, LIMITS, Now())
    old, new = await _job(store), await _job(store)
    await store.complete(old, b"x" * 600)
    await store.complete(new, b"y" * 600)
    assert await store.get(old) is None and (await store.get(new)) is not None
    huge = await _job(store)
    await store.complete(huge, b"z" * 1001)
    job = await store.get(huge)
    assert job is not None and job.status == "failed" and not store.file(huge).exists()
    await store.close()


async def test_deleted_while_running_keeps_no_file(tmp_path: Path) -> None:
    store = await VideoJobStore.open(tmp_path, LIMITS, Now())
    job_id = await _job(store)
    assert await store.delete(job_id)
    await store.complete(job_id, b"late")
    assert not store.file(job_id).exists() and not await store.delete(job_id)
    await store.close()


async def test_list_pages_newest_first(tmp_path: Path) -> None:
    now = Now()
    store = await VideoJobStore.open(tmp_path, StoreLimits(60, 10, 1000), now)
    ids = []
    for _ in range(5):
        ids.append(await _job(store))
        now.t += 1
    page, more = await store.list(after=None, limit=2, order="desc")
    assert [j.id for j in page] == ids[:-3:-1] and more
    page, more = await store.list(after=page[-1].id, limit=10, order="desc")
    assert [j.id for j in page] == ids[2::-1] and not more
    page, _ = await store.list(after=None, limit=10, order="asc")
    assert [j.id for j in page] == ids
    await store.close()
