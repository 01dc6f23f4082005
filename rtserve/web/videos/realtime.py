"""``WS /v1/realtime/video``: a video streamed as fragmented MP4 while it is generated
(docs/serving.md#streaming-video-output).

JSON text events both ways; every ``video.chunk_metadata`` is followed by exactly one binary
message holding the next fMP4 bytes (the first starts with the init segment), so a client that
concatenates the binary messages in order holds a playable file. One generation per connection:

* ``session.start`` (prompt and video fields as ``POST /v1/videos`` takes them, ``format``
  ``m4s``) within ``videos.start_timeout_s`` -> ``video.start``; otherwise ``error``
  ``start_timeout`` and the socket closes. A start the route refuses -> ``error`` naming the field,
  then close;
* chunks as segments are decoded: frames are encoded into fMP4 fragments on the codec executor
  as each latent frame is decoded, not after the whole video;
* ``session.ping`` -> ``session.pong`` and refreshes the stall clock, as does every denoising
  step and every chunk; ``videos.stall_timeout_s`` without any -> ``error``
  ``generation_stalled``, the generation is cancelled and the socket closes;
* ``session.stop`` cancels the generation (freed at the next step) -> ``session.done`` with
  ``cancelled: true``; a finished video -> ``session.done`` with the chunk count; then close;
* ``session.interaction`` (mid-generation prompt updates) -> ``error`` ``interaction_unsupported``:
  Wan pipelines take no prompt updates; the generation goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from rtserve import untrusted_json
from rtserve.codecs.fmp4 import FragmentedMp4Stream
from rtserve.engines.diffusion.video_request import VideoGeneration
from rtserve.errors import (
    GENERATION_STALLED,
    INTERACTION_UNSUPPORTED,
    INVALID_EVENT,
    INVALID_JSON,
    OUTPUT_BACKPRESSURE,
    SESSION_ALREADY_OPEN,
    START_TIMEOUT,
    UNSUPPORTED_FORMAT,
    RtserveError,
)
from rtserve.web.connections import Connections, close_socket
from rtserve.web.context import CTX
from rtserve.web.error_mapping import close_code
from rtserve.web.videos.job_runner import submit
from rtserve.web.videos.metrics import METRICS
from rtserve.web.videos.params import ParsedVideo, parse_video, read_reference
from rtserve.web.videos.service import ready_service

log = logging.getLogger(__name__)

FORMAT = "m4s"
CONNECTIONS = web.AppKey("realtime_video_connections", Connections)


def _error(exc: RtserveError) -> dict[str, Any]:
    return {"type": "error", "code": exc.code, "message": exc.message, "param": exc.param}


class VideoStreamConnection:
    def __init__(self, ws: web.WebSocketResponse, app: web.Application) -> None:
        self._ws = ws
        self._app = app
        self._limits = app[CTX].config.videos
        self._metrics = app[METRICS]
        self._alive = asyncio.Event()  # set by a step, a chunk or a ping: the stall clock restarts
        self._stopped = False
        self._chunks = 0
        self.request_id = f"video_{secrets.token_hex(8)}"

    async def send(self, event: dict[str, Any]) -> None:
        async with asyncio.timeout(self._limits.send_timeout_s):
            await self._ws.send_str(json.dumps(event))

    async def _receive_event(self) -> dict[str, Any] | None:
        """The next client event; None when the socket closed. Bad JSON is answered, then skipped."""
        while True:
            message = await self._ws.receive()
            if message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                return None
            if message.type != WSMsgType.TEXT:
                await self.send(_error(RtserveError("Events are JSON text messages.", code=INVALID_EVENT)))
                continue
            try:
                event = untrusted_json.loads(message.data)
            except ValueError:
                event = None
            if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                await self.send(_error(RtserveError("An event is a JSON object with a 'type'.", code=INVALID_JSON)))
                continue
            return event

    async def run(self) -> None:
        try:
            async with asyncio.timeout(self._limits.start_timeout_s):
                start = await self._receive_event()
                while start is not None and start["type"] != "session.start":
                    await self._answer(start)
                    start = await self._receive_event()
        except TimeoutError:
            await self._end(
                RtserveError(f"No session.start within {self._limits.start_timeout_s:g} s.", code=START_TIMEOUT)
            )
            return
        if start is None:
            return
        try:
            parsed = await self._parse(start)
            generation = submit(ready_service(self._app), parsed, self._alive, self._metrics)
        except RtserveError as exc:
            await self._end(exc)
            return
        await self._stream(generation, parsed)

    async def _parse(self, start: dict[str, Any]) -> ParsedVideo:
        if start.get("format", FORMAT) != FORMAT:
            raise RtserveError(
                f"Only format '{FORMAT}' (fragmented MP4) is served.", code=UNSUPPORTED_FORMAT, param="format"
            )
        fields = {k: v for k, v in start.items() if k not in ("type", "format")}
        parsed, reference = parse_video(fields, None, ready_service(self._app), self._limits)
        return await read_reference(self._app[CTX], parsed, reference)

    async def _stream(self, generation: VideoGeneration, parsed: ParsedVideo) -> None:
        request = parsed.request
        await self.send(
            {
                "type": "video.start",
                "request_id": self.request_id,
                "format": FORMAT,
                "config": {
                    "model": parsed.model,
                    "prompt": request.prompt,
                    "width": request.width,
                    "height": request.height,
                    "fps": parsed.fps,
                    "num_frames": request.num_frames,
                    "num_inference_steps": request.num_inference_steps,
                    "guidance_scale": request.guidance_scale,
                    "seed": request.seed,
                },
            }
        )
        tasks = {
            asyncio.ensure_future(self._produce(generation, parsed)),
            asyncio.ensure_future(self._read()),
            asyncio.ensure_future(self._watch()),
        }
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            ending = next(iter(done)).exception()
        finally:
            generation.cancel()  # a no-op once finished: frees the engine slot otherwise
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if isinstance(ending, RtserveError):
            await self._end(ending)
        elif ending is not None and not isinstance(ending, ConnectionError):
            raise ending
        elif self._stopped or not self._ws.closed:
            await self._done()

    async def _produce(self, generation: VideoGeneration, parsed: ParsedVideo) -> None:
        codecs = self._app[CTX].codecs
        request = parsed.request
        stream = FragmentedMp4Stream(request.width, request.height, parsed.fps)
        frames = 0
        async for segment in generation.segments():
            await self._chunk(await codecs.run(stream.add, segment), len(segment), final=False)
            frames += len(segment)
        await self._chunk(await codecs.run(stream.finish), 0, final=True)

    async def _chunk(self, data: bytes, frames: int, *, final: bool) -> None:
        await self.send(
            {
                "type": "video.chunk_metadata",
                "request_id": self.request_id,
                "chunk_index": self._chunks,
                "byte_length": len(data),
                "frames": frames,
                "final": final,
            }
        )
        try:
            async with asyncio.timeout(self._limits.send_timeout_s):
                await self._ws.send_bytes(data)
        except TimeoutError:
            raise RtserveError(
                f"The client took no video for {self._limits.send_timeout_s:g} s.", code=OUTPUT_BACKPRESSURE
            ) from None
        self._chunks += 1
        self._metrics.chunks.inc()
        self._metrics.chunk_bytes.inc(len(data))
        self._alive.set()

    async def _read(self) -> None:
        """Client events during the generation; returns once stopped or the socket closed."""
        while (event := await self._receive_event()) is not None:
            if event["type"] == "session.stop":
                self._stopped = True
                return
            await self._answer(event)
        raise ConnectionResetError  # the client went away: nothing more to send

    async def _answer(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "session.ping":
            self._alive.set()
            await self.send({"type": "session.pong", "event_id": event.get("event_id")})
        elif kind == "session.interaction":
            message = "This model takes no prompt updates during generation."
            await self.send(_error(RtserveError(message, code=INTERACTION_UNSUPPORTED, param="interaction")))
        elif kind == "session.start":
            await self.send(_error(RtserveError("A generation is already running.", code=SESSION_ALREADY_OPEN)))
        elif kind == "session.stop":
            await self.send(_error(RtserveError("No generation is running.", code=INVALID_EVENT, param="type")))
        else:
            await self.send(_error(RtserveError(f"Unknown event type '{kind}'.", code=INVALID_EVENT, param="type")))

    async def _watch(self) -> None:
        """Raise ``generation_stalled`` after ``stall_timeout_s`` without a step, a chunk or a ping."""
        while True:
            self._alive.clear()
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel that lands
                # as the event is set, and this watcher would then outlive its connection.
                async with asyncio.timeout(self._limits.stall_timeout_s):
                    await self._alive.wait()
            except TimeoutError:
                raise RtserveError(
                    f"No generation progress for {self._limits.stall_timeout_s:g} s.", code=GENERATION_STALLED
                ) from None

    async def _done(self) -> None:
        event = {
            "type": "session.done",
            "request_id": self.request_id,
            "chunks": self._chunks,
            "cancelled": self._stopped,
        }
        try:
            await self.send(event)
        except (ConnectionError, TimeoutError):
            return
        await close_socket(self._ws, WSCloseCode.OK, "done")

    async def _end(self, exc: RtserveError) -> None:
        try:
            await self.send(_error(exc))
        except (ConnectionError, TimeoutError):
            return
        code = close_code(exc)  # retry later for a full or loading engine; else the client's doing
        await close_socket(
            self._ws, code if code != WSCloseCode.INTERNAL_ERROR else WSCloseCode.POLICY_VIOLATION, exc.code
        )


async def realtime_video(request: web.Request) -> web.WebSocketResponse:
    app = request.app
    ws = web.WebSocketResponse(max_msg_size=app[CTX].config.videos.max_message_bytes)
    await ws.prepare(request)
    async with app[CONNECTIONS].track(ws):
        with app[METRICS].streams.track_inprogress():
            await VideoStreamConnection(ws, app).run()
    return ws


async def _close_all(app: web.Application) -> None:
    await app[CONNECTIONS].close_all()


def setup(app: web.Application) -> None:
    app[CONNECTIONS] = Connections("realtime_video", app[CTX].config.sessions.shutdown_timeout_s)
    app.on_shutdown.append(_close_all)
    app.router.add_get("/v1/realtime/video", realtime_video)
