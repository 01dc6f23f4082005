"""Runs ``/v1/videos`` jobs: each job is one task in this process that follows its generation on
the video engine, mirrors the progress into the job store and stores the finished MP4
(docs/serving.md#videos).

``queued`` until the engine prepares the request (it joined a wave), ``in_progress`` while it is
denoised (progress: steps done, up to 90 %) and decoded, then ``completed`` or ``failed`` with
the engine's typed error. Deleting a job cancels its generation: the engine drops it at the next
step boundary. Progress crosses from the engine thread as an event set through the loop; the
task writes one update per wake-up, however many steps happened meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import numpy as np

from rtserve.codecs.fmp4 import encode_mp4
from rtserve.engines.diffusion.video_request import VideoGeneration, VideoService
from rtserve.errors import GENERATION_FAILED, RtserveError
from rtserve.web.codec_executor import CodecExecutor
from rtserve.web.videos.job_store import JobStatus, VideoJob, VideoJobStore
from rtserve.web.videos.metrics import VideoMetrics
from rtserve.web.videos.params import ParsedVideo

log = logging.getLogger(__name__)

_DENOISE_SHARE = 90  # percent of progress the denoising steps stand for; decoding and encoding the rest


def submit(
    service: VideoService, parsed: ParsedVideo, progressed: asyncio.Event, metrics: VideoMetrics
) -> VideoGeneration:
    """Queue ``parsed`` on the engine; ``progressed`` is set (on the loop) after each of its steps."""
    loop = asyncio.get_running_loop()

    def on_progress() -> None:  # engine thread
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody follows this any more
            loop.call_soon_threadsafe(progressed.set)

    return metrics.timed(service.submit(parsed.request, on_progress))


async def render_mp4(generation: VideoGeneration, fps: int, codecs: CodecExecutor) -> bytes:
    """The generation's frames as one MP4; cancelling the caller cancels the generation."""
    try:
        segments = [segment async for segment in generation.segments()]
    finally:
        generation.cancel()  # a no-op once finished; frees the engine slot when cancelled
    return await codecs.run(encode_mp4, np.concatenate(segments), fps)


class VideoJobs:
    def __init__(
        self, store: VideoJobStore, service: VideoService, codecs: CodecExecutor, metrics: VideoMetrics
    ) -> None:
        self.store = store
        self._service = service
        self._codecs = codecs
        self._metrics = metrics
        self._tasks: dict[str, asyncio.Task[JobStatus]] = {}
        self._started: set[str] = set()  # jobs in_progress (the others in _tasks are queued)

    async def create(self, parsed: ParsedVideo) -> VideoJob:
        """A stored ``queued`` job whose generation is on the engine's queue (429 when either is full)."""
        request = parsed.request
        job = await self.store.create(
            model=parsed.model,
            prompt=request.prompt,
            size=parsed.size,
            seconds=parsed.seconds,
            params={
                "fps": parsed.fps,
                "num_frames": request.num_frames,
                "num_inference_steps": request.num_inference_steps,
                "guidance_scale": request.guidance_scale,
                "seed": request.seed,
            },
        )
        progressed = asyncio.Event()
        try:
            generation = submit(self._service, parsed, progressed, self._metrics)
        except RtserveError:
            await self.store.delete(job.id)
            raise
        task = asyncio.create_task(self._run(job.id, generation, parsed.fps, progressed), name=f"video-{job.id}")
        self._tasks[job.id] = task
        self._metrics.jobs.labels("queued").inc()
        task.add_done_callback(lambda done: self._ended(job.id, done))
        return job

    def _ended(self, job_id: str, task: asyncio.Task[JobStatus]) -> None:
        """Every job's task ends here, however it ended (cancelled before it ran too)."""
        self._tasks.pop(job_id, None)
        self._metrics.jobs.labels("in_progress" if job_id in self._started else "queued").dec()
        self._started.discard(job_id)
        if task.cancelled():
            ended: str = "cancelled"
        elif (exc := task.exception()) is not None:  # the store failed under it
            log.error("video job %s failed", job_id, exc_info=exc)
            ended = "failed"
        else:
            ended = task.result()
        self._metrics.jobs_ended.labels(ended).inc()

    async def delete(self, job_id: str) -> bool:
        task = self._tasks.pop(job_id, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return await self.store.delete(job_id)

    async def close(self) -> None:
        """Cancel every running job (the server stops; the store marks them interrupted on reopening)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, job_id: str, generation: VideoGeneration, fps: int, progressed: asyncio.Event) -> JobStatus:
        """The job's final status (``completed`` or ``failed``) once stored."""
        render = asyncio.ensure_future(render_mp4(generation, fps, self._codecs))
        try:
            while not render.done():
                waiter = asyncio.ensure_future(progressed.wait())
                await asyncio.wait({render, waiter}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if progressed.is_set():
                    progressed.clear()
                    if job_id not in self._started:  # the engine took it into a wave
                        self._started.add(job_id)
                        self._metrics.jobs.labels("queued").dec()
                        self._metrics.jobs.labels("in_progress").inc()
                        await self.store.start(job_id)
                    await self.store.progress(job_id, int(generation.progress * _DENOISE_SHARE))
            mp4 = await render
        except RtserveError as exc:
            await self.store.fail(job_id, exc.code, exc.message, exc.param)
            return "failed"
        except asyncio.CancelledError:
            render.cancel()
            await asyncio.gather(render, return_exceptions=True)
            raise
        except Exception:  # a job fails alone; the server goes on
            log.exception("video job %s failed", job_id)
            await self.store.fail(job_id, GENERATION_FAILED, "The video could not be generated.")
            return "failed"
        await self.store.complete(job_id, mp4)
        return "completed"
