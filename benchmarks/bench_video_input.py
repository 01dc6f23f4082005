"""CPU cost of one video call's camera input (docs/video.md#frames-in-the-conversation).

What a call costs the server, per stage, timed with ``time.process_time`` (every thread of the
process, libvpx's and libx264's included) over FRAMES frames of a 640x480 camera-like picture
(a moving gradient with noise, so the codec has work to do):

* decode: every frame the browser sends is decoded (aiortc's VP8 or H.264 decoder, PyAV's
  libvpx / ffmpeg h264 here), whether or not it is kept;
* keep (WebRTC): the frames ``video_input.sample_fps`` keeps are scaled by libswscale and
  stored as a JPEG data URL (``codecs.images.frame_data_url``);
* WS /v1/video/chat/stream: each sent JPEG's header is checked (``check_image``) and the kept
  ones are decoded at a reduced DCT scale, scaled and re-encoded (``image_data_url``).

The table quotes the median of RUNS runs and the share of one core a call takes at a camera
rate and the default sample rate (1 fps). Run:
``.venv/bin/python benchmarks/bench_video_input.py [--fps 30] [--sample-fps 1]``; results in
``benchmarks/results/bench_video_input.json``.
"""

from __future__ import annotations

import argparse
import fractions
import io
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import av
import numpy as np

from rtserve.codecs.images import check_image, frame_data_url, image_data_url
from rtserve.config import VideoInputConfig

WIDTH, HEIGHT = 640, 480
FRAMES = 90
RUNS = 5
RESULTS = Path(__file__).resolve().parent / "results" / "bench_video_input.json"


def camera_frames(count: int) -> list[av.VideoFrame]:
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    frames = []
    for i in range(count):
        picture = np.stack([(x + 4 * i) % 256, (y + 2 * i) % 256, (x + y + 3 * i) % 256], axis=-1)
        picture = (picture + rng.integers(0, 24, picture.shape)).clip(0, 255).astype(np.uint8)
        frame = av.VideoFrame.from_ndarray(picture, format="rgb24").reformat(format="yuv420p")
        frame.pts, frame.time_base = i, fractions.Fraction(1, 30)
        frames.append(frame)
    return frames


def encoded(frames: list[av.VideoFrame], codec: str) -> list[av.Packet[Any]]:
    """The frames as a browser would send them (about 1 Mbit/s at 30 fps)."""
    encoder = av.CodecContext.create(codec, "w")
    assert isinstance(encoder, av.VideoCodecContext)
    encoder.width, encoder.height, encoder.pix_fmt = WIDTH, HEIGHT, "yuv420p"
    encoder.time_base = fractions.Fraction(1, 30)
    encoder.bit_rate = 1_000_000
    packets = [p for frame in frames for p in encoder.encode(frame)]
    return packets + list(encoder.encode(None))


def measure(work: Callable[[], int]) -> float:
    """Median CPU milliseconds per item over RUNS runs (``work`` returns how many items it did)."""
    timings = []
    for _ in range(RUNS):
        start = time.process_time()
        items = work()
        timings.append((time.process_time() - start) * 1000.0 / items)
    return statistics.median(timings)


def decode_all(packets: list[av.Packet[Any]], codec: str) -> Callable[[], int]:
    def work() -> int:
        decoder = av.CodecContext.create(codec, "r")
        assert isinstance(decoder, av.VideoCodecContext)
        return sum(len(decoder.decode(packet)) for packet in packets)

    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fps", type=float, default=30.0, help="the camera's frame rate")
    parser.add_argument("--sample-fps", type=float, default=1.0, help="video_input.sample_fps")
    args = parser.parse_args()
    limits = VideoInputConfig(sample_fps=args.sample_fps)
    frames = camera_frames(FRAMES)
    jpegs = []
    for frame in frames[:10]:
        out = io.BytesIO()
        frame.to_image().save(out, format="JPEG", quality=85)  # type: ignore[no-untyped-call]  # unannotated in PyAV
        jpegs.append(out.getvalue())
    rows: dict[str, float] = {}
    for name, encoder, decoder in (("VP8", "libvpx", "vp8"), ("H.264", "libx264", "h264")):
        rows[f"decode {name} {WIDTH}x{HEIGHT}"] = measure(decode_all(encoded(frames, encoder), decoder))
    rows["keep: scale + JPEG (WebRTC frame)"] = measure(
        lambda: sum(bool(frame_data_url(f, limits)) for f in frames[:30])
    )
    rows["WS: check a JPEG header"] = measure(lambda: sum(bool(check_image(j, limits)) for j in jpegs * 10))
    rows["WS keep: decode (draft) + scale + JPEG"] = measure(
        lambda: sum(bool(image_data_url(j, limits)) for j in jpegs)
    )

    def share(ms: float, rate: float) -> float:
        return ms * rate / 10.0  # % of one core: ms per frame x frames per second / 1000 ms x 100

    per_call = {
        "WebRTC VP8": share(rows[f"decode VP8 {WIDTH}x{HEIGHT}"], args.fps)
        + share(rows["keep: scale + JPEG (WebRTC frame)"], args.sample_fps),
        "WebRTC H.264": share(rows[f"decode H.264 {WIDTH}x{HEIGHT}"], args.fps)
        + share(rows["keep: scale + JPEG (WebRTC frame)"], args.sample_fps),
        "WS (JPEG frames)": share(rows["WS: check a JPEG header"], args.fps)
        + share(rows["WS keep: decode (draft) + scale + JPEG"], args.sample_fps),
    }
    load = os.getloadavg()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {load[0]:.1f} (1 min)")
    print(f"{'stage':42} {'CPU ms/frame':>12}")
    for name, ms in rows.items():
        print(f"{name:42} {ms:12.2f}")
    print(f"\none call at {args.fps:g} fps camera, {args.sample_fps:g} fps kept, max_side {limits.max_side}:")
    print(f"{'path':20} {'% of a core':>12} {'calls per core':>15}")
    for name, pct in per_call.items():
        print(f"{name:20} {pct:12.1f} {100 / pct:15.1f}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "machine": {"cores": os.cpu_count(), "load_1min": load[0], "python": platform.python_version()},
                "camera": {"width": WIDTH, "height": HEIGHT, "fps": args.fps, "sample_fps": args.sample_fps},
                "cpu_ms_per_frame": rows,
                "core_percent_per_call": per_call,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
