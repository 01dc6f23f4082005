"""Support for the WebRTC call tests: an aiortc caller placing its call through the official
``openai`` SDK (``client.realtime.calls.create``), with every ICE candidate on 127.0.0.1.

The caller's microphone is a paced 48 kHz track that plays what the test queues (then
silence); everything the agent's track delivers is kept with its arrival time; every data
channel event is kept in order and validated against the SDK's own event types.
"""

from __future__ import annotations

import asyncio
import fractions
import json
from collections import deque
from typing import Any

import av
import numpy as np
import openai
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from rtserve.config import ServerConfig
from rtserve.web.webrtc.audio_in import frame_to_mono
from tests.web.realtime_support import HANG_GUARD_S, SDK_EVENT_TYPES, SDK_EVENTS

RATE = 48000
FRAME = 960  # 20 ms


def webrtc_config(config: ServerConfig) -> ServerConfig:
    config.webrtc.host_addresses = ["127.0.0.1"]  # process-wide: the test's own aiortc caller too
    return config


class Microphone(MediaStreamTrack):
    """A paced 48 kHz mono track: queued speech first, silence when there is none."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._pending: deque[np.ndarray] = deque()
        self._start: float | None = None
        self._sent = 0

    def say(self, pcm48k: np.ndarray) -> float:
        """Queue int16 audio; returns its duration in seconds."""
        pcm = np.asarray(pcm48k, dtype=np.int16)
        pcm = np.concatenate([pcm, np.zeros(-len(pcm) % FRAME, np.int16)])
        self._pending.extend(pcm[i : i + FRAME] for i in range(0, len(pcm), FRAME))
        return len(pcm) / RATE

    @property
    def idle(self) -> bool:
        return not self._pending

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        self._start = self._start or loop.time()
        delay = self._start + self._sent * FRAME / RATE - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        samples = self._pending.popleft() if self._pending else np.zeros(FRAME, np.int16)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = RATE, self._sent * FRAME, fractions.Fraction(1, RATE)
        self._sent += 1
        return frame


class Caller:
    """One aiortc peer: microphone out, agent audio and ``oai-events`` in."""

    def __init__(self, *, with_channel: bool = True) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.mic = Microphone()
        self.pc.addTrack(self.mic)
        self.channel = self.pc.createDataChannel("oai-events") if with_channel else None
        self.events: list[dict[str, Any]] = []
        self._arrived = asyncio.Event()
        self.audio: list[tuple[float, np.ndarray]] = []  # (arrival time, 48 kHz float32 mono frame)
        self._reader: asyncio.Task[None] | None = None
        self.call_id: str | None = None
        self.channel_open = asyncio.Event()
        if self.channel is not None:
            self.channel.on("message", self._on_message)
            self.channel.on("open", self.channel_open.set)
        self.pc.on("track", self._on_track)

    def _on_message(self, raw: str) -> None:
        event = json.loads(raw)
        if event["type"] in SDK_EVENT_TYPES:
            SDK_EVENTS.validate_json(raw)  # raises on any field the SDK's types reject
        self.events.append(event)
        self._arrived.set()

    def _on_track(self, track: MediaStreamTrack) -> None:
        self._reader = asyncio.get_running_loop().create_task(self._read(track))

    async def _read(self, track: MediaStreamTrack) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            assert isinstance(frame, av.AudioFrame)
            self.audio.append((loop.time(), frame_to_mono(frame)))

    async def offer(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def call(self, client: openai.AsyncOpenAI, session: dict[str, Any] | None = None) -> str:
        """Place the call through the SDK; returns the call id (from ``Location``)."""
        offer = await self.offer()
        kwargs: dict[str, Any] = {"sdp": offer} if session is None else {"sdp": offer, "session": session}
        answer = await client.realtime.calls.with_raw_response.create(**kwargs)
        assert answer.status_code == 201, answer.status_code
        assert answer.headers["content-type"].startswith("application/sdp")
        location = answer.headers["location"]
        self.call_id = location.rsplit("/", 1)[-1]
        sdp = answer.parse().text  # the SDK's binary response content
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))
        return self.call_id

    async def next_event(self, index: int, timeout_s: float = HANG_GUARD_S) -> dict[str, Any]:
        while len(self.events) <= index:
            self._arrived.clear()
            await asyncio.wait_for(self._arrived.wait(), timeout_s)
        return self.events[index]

    async def until(self, event_type: str, *, start: int = 0, timeout_s: float = HANG_GUARD_S) -> dict[str, Any]:
        """The first event of ``event_type`` at or after index ``start``."""
        try:
            async with asyncio.timeout(timeout_s):
                i = start
                while True:
                    event = await self.next_event(i, timeout_s)
                    if event["type"] == event_type:
                        return event
                    i += 1
        except TimeoutError:
            raise AssertionError(f"no {event_type} after event {start}; got {self.types()[start:][-30:]}") from None

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    def audio_since(self, t0: float) -> np.ndarray:
        frames = [f for t, f in self.audio if t >= t0]
        return np.concatenate(frames) if frames else np.zeros(0, np.float32)

    async def close(self) -> None:
        await self.pc.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)


def tone(freq: float, seconds: float, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (amplitude * 32767 * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def dominant_hz(samples: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.fft.rfftfreq(len(samples), 1 / RATE)[int(np.argmax(spectrum))])
