"""``POST /v1/realtime/calls`` on the loopback engine, placed by an aiortc caller through the
official ``openai`` SDK (``client.realtime.calls.create``), every candidate on 127.0.0.1.

The loopback engine returns the caller's audio one frame later, so a tone spoken into the
microphone must come back on the agent's track (through Opus both ways and the resamplers);
the ``oai-events`` data channel carries the session's events, validated by the SDK's types.
"""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
import openai
import pytest
from aiortc import RTCSessionDescription

from rtserve.config import ServerConfig
from tests.web.realtime_support import HANG_GUARD_S, loopback_config, running
from tests.web.webrtc_support import Caller, dominant_hz, tone, webrtc_config

SESSION = {"type": "realtime", "instructions": "echo me", "audio": {"output": {"voice": "joe"}}}


def sdk(base: str, key: str = "sk-test") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=key, timeout=HANG_GUARD_S, max_retries=0)


async def metric(base: str, name: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(f"{base}/metrics") as resp:
        text = await resp.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def wait_metric(base: str, name: str, value: float) -> None:
    async with asyncio.timeout(HANG_GUARD_S):
        while await metric(base, name) != value:
            await asyncio.sleep(0.05)


async def test_sdk_call_echoes_speech_on_the_track_and_hangup_closes_the_session(config: ServerConfig) -> None:
    async with running(webrtc_config(loopback_config(config))) as base:
        client = sdk(base)
        caller = Caller()
        call_id = await caller.call(client, session=SESSION)
        created = await caller.until("session.created")
        assert created["session"]["instructions"] == "echo me"
        assert created["session"]["audio"]["output"]["voice"] == "joe"
        await caller.until("output_audio_buffer.started")
        assert await metric(base, "rtserve_webrtc_calls ") == 1

        loop = asyncio.get_running_loop()
        t0 = loop.time()
        caller.mic.say(tone(440, 1.0))
        async with asyncio.timeout(HANG_GUARD_S):
            while True:
                heard = caller.audio_since(t0)
                loud = np.flatnonzero(np.abs(heard) > 0.1)
                if loud.size and heard.size >= loud[0] + 24000:
                    break
                await asyncio.sleep(0.1)
        assert abs(dominant_hz(heard[loud[0] : loud[0] + 24000]) - 440) < 10  # the caller's tone, back
        assert "response.output_audio.delta" not in caller.types()  # audio plays on the track only

        async with aiohttp.ClientSession() as http:
            async with http.post(f"{base}/v1/realtime/calls/{call_id}/hangup") as resp:
                assert resp.status == 200
            closed = await caller.until("session.closed")
            assert closed["reason"] == "hangup"
            await wait_metric(base, "rtserve_webrtc_calls ", 0)
            async with http.post(f"{base}/v1/realtime/calls/{call_id}/hangup") as resp:
                assert resp.status == 404
                assert (await resp.json())["error"]["code"] == "unknown_call"
        async with asyncio.timeout(HANG_GUARD_S):
            while caller.pc.connectionState != "closed":
                await asyncio.sleep(0.05)
        await caller.close()


async def test_browser_shaped_raw_sdp_call_and_client_clear_and_peer_close(config: ServerConfig) -> None:
    async with running(webrtc_config(loopback_config(config))) as base:
        caller = Caller()
        offer = await caller.offer()
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{base}/v1/realtime/calls", data=offer, headers={"Content-Type": "application/sdp"}) as resp,
        ):
            assert resp.status == 201
            assert resp.headers["Location"].startswith("/v1/realtime/calls/rtc_")
            answer = await resp.text()
        await caller.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        started = await caller.until("output_audio_buffer.started")
        assert caller.channel is not None
        await caller.channel_open.wait()
        caller.channel.send('{"type":"output_audio_buffer.clear","event_id":"clear-1"}')
        cleared = await caller.until("output_audio_buffer.cleared")
        assert cleared["response_id"] == started["response_id"]
        await caller.until("output_audio_buffer.started", start=caller.events.index(cleared))  # flows on
        assert "error" not in caller.types()  # nothing was refused (the open stream is not truncated)
        await caller.close()  # the peer goes away: the session ends with it
        await wait_metric(base, 'rtserve_webrtc_calls_ended_total{reason="peer_closed"}', 1)
        assert await metric(base, "rtserve_webrtc_calls ") == 0
        await wait_metric(base, "rtserve_sessions_slots_in_use ", 0)


async def test_bad_offers_get_typed_400s(config: ServerConfig) -> None:
    async with running(webrtc_config(loopback_config(config))) as base:
        client = sdk(base)
        with pytest.raises(openai.BadRequestError) as bad:
            await client.realtime.calls.create(sdp="hello")
        assert (bad.value.code, bad.value.param) == ("invalid_sdp", "sdp")
        data_only = "\r\n".join(line for line in (await Caller().offer()).splitlines())
        data_only = data_only.split("m=audio")[0] + "m=application" + data_only.split("m=application")[1]
        with pytest.raises(openai.BadRequestError) as bad:
            await client.realtime.calls.create(sdp=data_only)
        assert bad.value.code == "invalid_sdp" and "audio" in str(bad.value.message)
        offer = await Caller().offer()
        with pytest.raises(openai.BadRequestError) as bad:
            # A wrongly typed field on purpose: the server names it.
            await client.realtime.calls.create(sdp=offer, session={"type": "realtime", "instructions": 3})  # type: ignore[arg-type]
        assert bad.value.param == "session.instructions"
        with pytest.raises(openai.BadRequestError) as bad:
            await client.realtime.calls.create(sdp=offer, session={"type": "realtime", "instructions": "x" * 40000})
        assert (bad.value.code, bad.value.param) == ("invalid_value", "session.instructions")
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{base}/v1/realtime/calls", json={"sdp": offer}) as resp:
                assert resp.status == 415
                assert (await resp.json())["error"]["code"] == "invalid_sdp"
            mangled = offer.replace("a=fingerprint:", "a=fingerprint-x:")
            async with http.post(
                f"{base}/v1/realtime/calls", data=mangled, headers={"Content-Type": "application/sdp"}
            ) as resp:
                assert resp.status == 400
                body = await resp.json()
                assert body["error"]["code"] == "invalid_sdp"
                assert "Traceback" not in body["error"]["message"]
        await wait_metric(base, "rtserve_sessions_slots_in_use ", 0)  # refused offers leave no session


async def test_full_server_answers_429_and_unconnected_call_times_out(config: ServerConfig) -> None:
    config = webrtc_config(loopback_config(config))
    config.webrtc.max_calls = 1
    config.webrtc.connect_timeout_s = 1.0
    async with running(config) as base:
        client = sdk(base)
        silent = Caller()
        await client.realtime.calls.create(sdp=await silent.offer())  # the answer is never applied
        with pytest.raises(openai.RateLimitError) as full:
            await client.realtime.calls.create(sdp=await Caller().offer())
        assert full.value.code == "resource_exhausted"
        await wait_metric(base, 'rtserve_webrtc_calls_ended_total{reason="connect_timeout"}', 1)
        await wait_metric(base, "rtserve_sessions_slots_in_use ", 0)
        caller = Caller()
        await caller.call(client)  # room again
        await caller.until("session.created")
        await caller.close()
        await silent.close()


async def test_calls_share_the_session_managers_admission_with_websocket_sessions(config: ServerConfig) -> None:
    config = webrtc_config(loopback_config(config, max_sessions=1))
    async with running(config) as base:
        client = sdk(base)
        async with client.realtime.connect(model="loopback") as conn:  # a WebSocket session holds the one slot
            assert (await asyncio.wait_for(conn.recv(), HANG_GUARD_S)).type == "session.created"
            with pytest.raises(openai.RateLimitError) as full:
                await client.realtime.calls.create(sdp=await Caller().offer())
            assert full.value.code == "resource_exhausted"
        await wait_metric(base, "rtserve_sessions_slots_in_use ", 0)
        caller = Caller()
        await caller.call(client)
        await caller.until("session.created")
        await caller.close()


async def test_offers_aiortc_cannot_take_get_typed_400s_not_500s(
    config: ServerConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by tests/fuzz/test_fuzz_sdp.py: each of these made aiortc's parser or peer connection
    raise (AssertionError, AttributeError, a connect task failing in the background): a 500."""
    async with running(webrtc_config(loopback_config(config))) as base:
        caller = Caller()
        offer = await caller.offer()
        await caller.close()
        lines = offer.splitlines()
        broken = [
            [line for line in lines if line != "a=mid:0"],  # the audio section loses its mid
            [line for line in lines if line != "a=mid:1"],  # the data channel's mid, named by BUNDLE
            [line.replace("a=mid:1", "a=mid:999999999") for line in lines],
            [line.replace("c=IN IP4 127.0.0.1", "c=IN IP5 127.0.0.1") for line in lines],
            [line.replace("a=fingerprint:sha-256 ", "a=fingerprint:sha-256") for line in lines],
            [line for line in lines if line != "a=sendrecv"],  # no direction on the audio section
        ]
        async with aiohttp.ClientSession() as http:
            for case, sdp in enumerate(broken):
                async with http.post(
                    f"{base}/v1/realtime/calls",
                    data="\r\n".join(sdp) + "\r\n",
                    headers={"Content-Type": "application/sdp"},
                ) as resp:
                    assert resp.status == 400, case
                    error = (await resp.json())["error"]
                    assert (error["code"], error["param"]) == ("invalid_sdp", "sdp")
        await wait_metric(base, "rtserve_sessions_slots_in_use ", 0)
        assert not [r for r in caplog.records if r.levelno >= 30], caplog.records
