"""Hostile ``POST /v1/realtime/calls`` bodies and bursts: each is refused with a typed error at a
bounded cost, the event loop stays free for everyone else, and ``webrtc.max_calls`` holds when
offers arrive all at once."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from rtserve.config import ServerConfig
from tests.web.realtime_support import HANG_GUARD_S, loopback_config, running
from tests.web.webrtc.test_webrtc_calls import metric
from tests.web.webrtc_support import Caller, webrtc_config

CALLS = "/v1/realtime/calls"


async def _offer() -> str:
    caller = Caller()
    offer = await caller.offer()
    await caller.close()
    return offer


def _multipart(preamble: bytes, sdp: str, part_headers: bytes = b"") -> bytes:
    return (
        preamble
        + b'--B\r\nContent-Disposition: form-data; name="sdp"\r\n'
        + part_headers
        + b"\r\n"
        + sdp.encode()
        + b"\r\n--B--\r\n"
    )


async def _post(http: aiohttp.ClientSession, url: str, body: bytes, content_type: str) -> tuple[int, dict, float]:
    started = time.monotonic()
    async with http.post(url, data=body, headers={"Content-Type": content_type}) as resp:
        payload = await resp.json() if resp.content_type == "application/json" else {}
        return resp.status, payload.get("error", {}), time.monotonic() - started


async def _health_while(http: aiohttp.ClientSession, base: str, work: asyncio.Task) -> float:
    """The slowest /health answer while ``work`` runs: what every other client waited."""
    slowest = 0.0
    while not work.done():
        started = time.monotonic()
        async with http.get(f"{base}/health") as resp:
            assert resp.status == 200
        slowest = max(slowest, time.monotonic() - started)
        await asyncio.sleep(0.02)
    return slowest


async def test_a_multipart_body_of_empty_parts_is_refused_without_stalling_the_server(config: ServerConfig) -> None:
    # Before: 4 MiB of "--B\r\n\r\n\r\n" ahead of a valid sdp part answered 201 after 10.3 s, and
    # /health waited as long (the standard library's MIME parser on the event loop).
    async with running(webrtc_config(loopback_config(config))) as base, aiohttp.ClientSession() as http:
        body = _multipart(b"--B\r\n\r\n\r\n" * (4 * 1024 * 1024 // 10), await _offer())
        post = asyncio.ensure_future(_post(http, base + CALLS, body, "multipart/form-data; boundary=B"))
        slowest_health = await _health_while(http, base, post)
        status, error, took = await post
        assert (status, error["code"], error["param"]) == (400, "invalid_sdp", "sdp")
        assert "at most 4" in error["message"]
        assert took < 6.0 and slowest_health < 2.5, (took, slowest_health)  # before: both 10.3 s


async def test_malformed_and_encoded_parts_get_typed_400s(config: ServerConfig) -> None:
    async with running(webrtc_config(loopback_config(config))) as base, aiohttp.ClientSession() as http:
        offer = await _offer()
        for body, content_type in (
            (_multipart(b"", offer, b"X-Long: " + b"a" * 20000 + b"\r\n"), "multipart/form-data; boundary=B"),
            (_multipart(b"", offer, b"Content-Encoding: deflate\r\n"), "multipart/form-data; boundary=B"),
            (b"--B\r\n\r\n" + b"x" * 100, "multipart/form-data; boundary=B"),  # never terminated
            (_multipart(b"", offer), "multipart/form-data"),  # no boundary
        ):
            status, error, _ = await _post(http, base + CALLS, body, content_type)
            assert status == 400 and error["code"] == "invalid_sdp", (status, error)
            assert "Traceback" not in error["message"]
        # Before: 3000 nested parentheses in a part header -> 500 with a RecursionError traceback.
        # The header is only odd, not wrong: the offer in the part is answered.
        nested = b"Content-Type: text/plain; x=" + b"(" * 3000 + b")" * 3000 + b"\r\n"
        status, error, _ = await _post(
            http, base + CALLS, _multipart(b"", offer, nested), "multipart/form-data; boundary=B"
        )
        assert status == 201, error


async def test_offers_with_more_media_sections_than_a_call_uses_are_refused(config: ServerConfig) -> None:
    # Before: an offer with 1000 audio sections was answered 201.
    async with running(webrtc_config(loopback_config(config))) as base, aiohttp.ClientSession() as http:
        offer = await _offer()
        head, audio = offer.split("m=audio", 1)
        audio_section = "m=audio" + audio.split("m=application", 1)[0]
        many = head + audio_section * 1000 + "m=application" + offer.split("m=application", 1)[1]
        status, error, _ = await _post(http, base + CALLS, many.encode()[:60000], "application/sdp")
        assert (status, error["code"]) == (400, "invalid_sdp")
        assert "more media sections than a call uses" in error["message"]
        status, error, _ = await _post(http, base + CALLS, many.encode(), "application/sdp")
        assert (status, error["code"]) == (413, "request_too_large")
        assert await metric(base, "rtserve_sessions_slots_in_use ") == 0


async def test_max_calls_holds_when_offers_arrive_at_once(config: ServerConfig) -> None:
    # Before: with max_calls=3, 12 offers sent at once all got 201 (the cap was checked before an
    # await and counted after it).
    config = webrtc_config(loopback_config(config))
    config.webrtc.max_calls = 3
    config.webrtc.connect_timeout_s = HANG_GUARD_S  # the answers are never applied: keep the calls placed
    async with running(config) as base, aiohttp.ClientSession() as http:
        offers = [await _offer() for _ in range(12)]
        results = await asyncio.gather(
            *(_post(http, base + CALLS, offer.encode(), "application/sdp") for offer in offers)
        )
        statuses = sorted(status for status, _, _ in results)
        assert statuses == [201] * 3 + [429] * 9, statuses
        assert {error["code"] for status, error, _ in results if status == 429} == {"resource_exhausted"}
        assert await metric(base, "rtserve_webrtc_calls ") == 3
