"""The call's audio pieces on their own: the paced outbound track (bounded queue, started /
stopped per response, barge-in clear) and the inbound reader (continuous, bounded backlog)."""

from __future__ import annotations

import asyncio
import fractions

import av
import numpy as np
from aiortc.rtcrtpreceiver import RemoteStreamTrack
from prometheus_client import CollectorRegistry, Counter

from rtserve.sessions import commands as cmd
from rtserve.web.webrtc.audio_in import InboundAudio
from rtserve.web.webrtc.audio_out import FRAME_SAMPLES, OutboundAudioTrack

ENGINE_RATE = 24000


REGISTRY = CollectorRegistry()


def counter(name: str) -> Counter:
    return Counter(name, name, registry=CollectorRegistry())


def track(queue_ms: int = 4000) -> tuple[OutboundAudioTrack, list[tuple[str, str]]]:
    notices: list[tuple[str, str]] = []
    out = OutboundAudioTrack(
        queue_ms,
        on_started=lambda r: notices.append(("started", r)),
        on_stopped=lambda r: notices.append(("stopped", r)),
        late_frames=counter("late"),
    )
    return out, notices


def speech(seconds: float) -> np.ndarray:
    return np.full(int(seconds * ENGINE_RATE), 0.25, dtype=np.float32)


async def test_track_paces_20ms_frames_announces_each_response_and_sends_silence_between() -> None:
    out, notices = track()
    loop = asyncio.get_running_loop()
    first = await out.recv()  # the media path connects: silence until audio is queued
    assert first.samples == FRAME_SAMPLES and first.sample_rate == 48000 and not np.any(first.to_ndarray())
    await out.push("resp_1", speech(0.1), ENGINE_RATE)
    out.end_response("resp_1")
    t0 = loop.time()
    frames = [await out.recv() for _ in range(10)]
    assert 0.15 < loop.time() - t0 < 0.5  # paced, not as fast as possible
    loud = [bool(np.any(f.to_ndarray())) for f in frames]
    assert loud[:5] == [True] * 5 and not any(loud[7:])  # 100 ms (+ the resampler's tail), then silence
    assert [f.pts for f in frames] == [FRAME_SAMPLES * (i + 1) for i in range(10)]
    assert notices == [("started", "resp_1"), ("stopped", "resp_1")]


async def test_push_waits_while_the_queue_is_full_and_clear_drops_everything_at_once() -> None:
    out, notices = track(queue_ms=100)  # 5 frames
    await out.recv()
    pushing = asyncio.create_task(out.push("resp_1", speech(1.0), ENGINE_RATE))
    await asyncio.sleep(0.05)
    assert not pushing.done()  # a second of audio does not fit: the producer waits
    await out.recv()
    assert out.clear() == ["resp_1"]
    await asyncio.wait_for(pushing, 1)  # released, and nothing of the cut response is queued
    assert not np.any((await out.recv()).to_ndarray())
    assert notices == [("started", "resp_1")]  # cut off: cleared, never "stopped"


class _Handle:
    """What the reader needs of the session (``SessionInput``): it keeps the audio submitted."""

    def __init__(self) -> None:
        self.submitted: list[np.ndarray] = []
        self.closed = False

    def submit(self, command: cmd.AppendAudio) -> None:
        self.submitted.append(command.audio)


def mic_frame(i: int) -> av.AudioFrame:
    samples = np.full((1, 2 * 960), 1000, dtype=np.int16)  # packed stereo, as aiortc's Opus decoder gives
    frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="stereo")
    frame.sample_rate, frame.pts, frame.time_base = 48000, i * 960, fractions.Fraction(1, 48000)
    return frame


async def test_reader_drops_the_oldest_backlog_beyond_its_bound_and_resamples_the_rest() -> None:
    remote = RemoteStreamTrack(kind="audio")
    for i in range(40):  # the loop was starved: 800 ms of microphone audio piled up
        remote._queue.put_nowait(mic_frame(i))
    remote._queue.put_nowait(None)  # end of track
    handle = _Handle()
    dropped = Counter("dropped", "dropped", registry=REGISTRY)
    reader = InboundAudio(remote, handle, ENGINE_RATE, backlog_frames=10, dropped=dropped)
    await asyncio.wait_for(reader.run(), 5)
    assert reader.frames + reader.dropped_frames == 40 and reader.frames <= 11
    assert REGISTRY.get_sample_value("dropped_total") == reader.dropped_frames >= 29
    audio = np.concatenate(handle.submitted)
    assert 0 < len(audio) <= 11 * 480 and np.allclose(audio[-100:], 1000 / 32768, atol=1e-3)  # 24 kHz mono
