"""``WS /v1/realtime?duplex=1`` and ``WS /v1/duplex`` on the loopback engine (raw WebSocket):
capabilities and fallback, duplex control events, detach and resume with journal replay,
``session.replaced``, expiry by disconnect grace and by idle TTL."""

from __future__ import annotations

import asyncio
import base64

import aiohttp
import numpy as np

from rtserve.config import ServerConfig
from tests.web.realtime_support import (
    HANG_GUARD_S,
    b64_pcm16,
    close_code,
    closing_codes,
    echoed_tags,
    frame_tag,
    loopback_config,
    pcm16_b64,
    read_to_close,
    read_until,
    receive_event,
    running,
    tagged_frame,
    types,
    ws_url,
)


async def metric(http: aiohttp.ClientSession, base: str, line: str) -> bool:
    async with http.get(f"{base}/metrics") as resp:
        return line in await resp.text()


async def wait_for_metric(http: aiohttp.ClientSession, base: str, line: str) -> None:
    for _ in range(int(HANG_GUARD_S / 0.05)):
        if await metric(http, base, line):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"metric never showed {line!r}")


async def test_duplex_advertises_capabilities_and_turn_based_does_not(config: ServerConfig) -> None:
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, duplex="1")) as ws:
            created = await receive_event(ws)
            assert created is not None
            following = await receive_event(ws)
            assert following is not None
        async with http.ws_connect(ws_url(base)) as ws:
            plain = await receive_event(ws)
            assert plain is not None
            plain_following = await receive_event(ws)
            assert plain_following is not None
    capabilities = created["session"]["capabilities"]
    assert capabilities["mode"] == "lockstep" and capabilities["chunk_period_ms"] == 80
    assert capabilities["supports_session_resume"] is True and capabilities["supports_barge_in"] is False
    assert created["resume_token"] and created["attachment_generation"] == 0 and created["epoch"] == 0
    assert following["type"] != "conversation.created"
    assert "capabilities" not in plain["session"] and "resume_token" not in plain
    assert plain_following["type"] == "conversation.created"


async def test_without_duplex_sessions_realtime_falls_back_and_duplex_route_refuses(config: ServerConfig) -> None:
    config.transport.duplex_sessions = False
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, duplex="1")) as ws:
            created = await receive_event(ws)
            assert created is not None
            # silently turn-based (docs/sessions.md#dialects-and-fallback)
            assert "capabilities" not in created["session"]
            assert (await receive_event(ws) or {}).get("type") == "conversation.created"
        async with http.ws_connect(ws_url(base, "/v1/duplex")) as ws:
            refused = await receive_event(ws)
            assert refused is not None
            assert refused["error"]["message"] == "Duplex API is not available"
            assert refused["error"]["code"] == "duplex_unavailable"
            assert await close_code(ws) == aiohttp.WSCloseCode.POLICY_VIOLATION


async def test_duplex_control_events_and_client_close(config: ServerConfig) -> None:
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, duplex="1")) as ws:
            await receive_event(ws)
            await ws.send_json({"type": "input_audio_buffer.append", "audio": pcm16_b64(tagged_frame(5))})
            seen = await read_until(ws, lambda e: 5 in echoed_tags([e]))
            response_id = seen[-1]["response_id"]
            await ws.send_json({"type": "session.heartbeat", "event_id": "hb"})
            await read_until(ws, "session.heartbeat_ack")
            await ws.send_json({"type": "playback.ack", "response_id": response_id, "played_ms": 80})
            acked = (await read_until(ws, "playback.acknowledged"))[-1]
            assert (acked["response_id"], acked["played_ms"]) == (response_id, 80)
            await ws.send_json({"type": "overlap.decision", "action": "listen", "overlap_ms": 120})
            decision = (await read_until(ws, "overlap.decision"))[-1]
            assert (decision["action"], decision["overlap_ms"]) == ("listen", 120)
            await ws.send_json({"type": "turn.signal", "event": "barge_in", "event_id": "b1"})
            error = (await read_until(ws, "error"))[-1]["error"]
            assert (error["code"], error["event_id"]) == ("barge_in_unsupported", "b1")  # loopback cannot

            await ws.send_json({"type": "session.close"})
            tail = await read_to_close(ws)
            assert closing_codes[ws] == aiohttp.WSCloseCode.OK
    assert tail[-1]["type"] == "session.closed" and tail[-1]["reason"] == "client_close"
    done = [e for e in tail if e["type"] == "response.done"]
    assert len(done) == 1 and done[0]["response"]["id"] == response_id  # the one continuous response
    assert done[0]["response"]["status"] == "completed"
    assert all(e["epoch"] == 0 for e in tail)  # duplex events carry the epoch


async def test_a_second_of_audio_arriving_at_once_is_echoed_whole_and_in_order(config: ServerConfig) -> None:
    """A client (or its network, or the server's event loop) held up for a second, then the held
    audio arriving at once: within lockstep.max_input_backlog_ms nothing is dropped."""
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, duplex="1")) as ws:
            await receive_event(ws)
            for tag in range(1, 13):  # 12 frames of 80 ms, back to back
                await ws.send_json({"type": "input_audio_buffer.append", "audio": pcm16_b64(tagged_frame(tag))})
            seen = await read_until(ws, lambda e: 12 in echoed_tags([e]))
    assert echoed_tags(seen) == list(range(1, 13))


async def test_resume_replays_what_the_client_missed_and_rotates_the_token(config: ServerConfig) -> None:
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        first = await http.ws_connect(ws_url(base, duplex="1"))
        created = await receive_event(first)
        assert created is not None
        session_id, token = created["session"]["id"], created["resume_token"]
        received = [created, *await read_until(first, "response.output_audio.delta")]
        last_seq = received[-1]["server_event_seq"]
        for tag in (11, 12, 13):  # echoed while nobody is attached: only the journal has them
            await first.send_json({"type": "input_audio_buffer.append", "audio": pcm16_b64(tagged_frame(tag))})
        await first.close()

        async with http.ws_connect(ws_url(base, duplex="1", autostart="0")) as second:
            await second.send_json(
                {
                    "type": "session.resume",
                    "event_id": "resume-1",
                    "session_id": session_id,
                    "resume_token": token,
                    "attachment_generation": 0,
                    "last_received_server_event_seq": last_seq,
                }
            )
            resumed = await receive_event(second)
            assert resumed is not None
            after = await read_until(second, lambda e: 13 in echoed_tags([e]))
            await second.send_json(
                {"type": "session.resume", "session_id": session_id, "resume_token": token, "attachment_generation": 1}
            )
            refused = (await read_until(second, "error"))[-1]["error"]
    assert resumed["type"] == "session.resumed" and resumed["session_id"] == session_id
    assert resumed["attachment_generation"] == 1 and resumed["resume_token"] not in (None, token)
    seqs = [e["server_event_seq"] for e in after]
    assert seqs == list(range(last_seq + 1, last_seq + 1 + len(seqs)))  # no gap, no duplicate
    assert echoed_tags(after)[-3:] == [11, 12, 13]
    assert refused["code"] == "session_already_open"


async def test_resume_elsewhere_replaces_the_old_socket_and_stale_credentials_are_refused(config) -> None:
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, duplex="1")) as old:
            created = await receive_event(old)
            assert created is not None
            session_id, token = created["session"]["id"], created["resume_token"]
            async with http.ws_connect(ws_url(base, duplex="1", autostart="0")) as new:
                await new.send_json(
                    {
                        "type": "session.resume",
                        "session_id": session_id,
                        "resume_token": token,
                        "attachment_generation": 0,
                    }
                )
                resumed = await receive_event(new)
                assert resumed is not None
                tail = await read_to_close(old)
                assert tail[-1]["type"] == "session.replaced"
                assert tail[-1]["attachment_generation"] == 1
                assert closing_codes[old] == aiohttp.WSCloseCode.OK

                async with http.ws_connect(ws_url(base, duplex="1", autostart="0")) as third:
                    await third.send_json(
                        {
                            "type": "session.resume",
                            "session_id": session_id,
                            "resume_token": token,
                            "attachment_generation": 1,
                        }
                    )
                    wrong_token = await receive_event(third)
                    assert wrong_token is not None
                    await third.send_json(
                        {
                            "type": "session.resume",
                            "session_id": session_id,
                            "resume_token": resumed["resume_token"],
                            "attachment_generation": 0,
                        }
                    )
                    stale_generation = await receive_event(third)
                    assert stale_generation is not None
                await new.send_json({"type": "input_audio_buffer.append", "audio": pcm16_b64(tagged_frame(21))})
                await read_until(new, lambda e: 21 in echoed_tags([e]))  # the resumed socket keeps flowing
    assert wrong_token["error"]["code"] == "unknown_session"
    assert stale_generation["error"]["code"] == "session_resume_conflict"


async def test_detached_session_expires_after_the_grace(config: ServerConfig) -> None:
    config = loopback_config(config, disconnect_grace_s=0.2, reaper_interval_s=0.05)
    async with running(config) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, duplex="1")) as ws:
            created = await receive_event(ws)
            assert created is not None
        await wait_for_metric(
            http, base, 'rtserve_sessions_ended_total{kind="expired",reason="disconnect_grace_expired"} 1.0'
        )
        async with http.ws_connect(ws_url(base, duplex="1", autostart="0")) as ws:
            await ws.send_json(
                {
                    "type": "session.resume",
                    "session_id": created["session"]["id"],
                    "resume_token": created["resume_token"],
                    "attachment_generation": 0,
                }
            )
            refused = await receive_event(ws)
            assert refused is not None
    assert refused["error"]["code"] == "unknown_session"


async def test_idle_session_gets_session_expired_then_the_socket_closes(config: ServerConfig) -> None:
    config = loopback_config(config, idle_ttl_s=0.3, reaper_interval_s=0.05)
    async with running(config) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, duplex="1")) as ws:
            events = await read_to_close(ws)
            assert closing_codes[ws] == aiohttp.WSCloseCode.OK
    assert events[-1]["type"] == "session.expired" and events[-1]["reason"] == "idle_ttl_expired"
    assert types(events).count("session.expired") == 1


async def test_native_duplex_route_opens_on_session_create(config: ServerConfig) -> None:
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, "/v1/duplex")) as ws:
            await ws.send_json(
                {"type": "input_audio_buffer.append", "audio": pcm16_b64(tagged_frame(1)), "event_id": "early"}
            )
            early = await receive_event(ws)
            assert early is not None
            await ws.send_json(
                {"type": "session.create", "session": {"instructions": "be a mirror", "output_audio_format": "pcm16"}}
            )
            created = await receive_event(ws)
            assert created is not None
            await ws.send_json({"type": "input_audio_buffer.append", "audio": pcm16_b64(tagged_frame(3))})
            echoed = (
                await read_until(
                    ws, lambda e: e["type"] == "response.output_audio.delta" and frame_tag(b64_pcm16(e["audio"])) == 3
                )
            )[-1]
            # A chunk may name its own format (PersonaPlex's driver sends float32 frames).
            as_f32 = (tagged_frame(4).astype(np.float32) / 32768).astype("<f4").tobytes()
            await ws.send_json(
                {
                    "type": "input_audio_buffer.append",
                    "audio": base64.b64encode(as_f32).decode(),
                    "format": "pcm_f32le",
                    "sample_rate_hz": 24000,
                }
            )
            await read_until(
                ws, lambda e: e["type"] == "response.output_audio.delta" and frame_tag(b64_pcm16(e["audio"])) == 4
            )
            await ws.send_json({"type": "session.close"})
            tail = await read_to_close(ws)
    assert (early["error"]["code"], early["error"]["event_id"]) == ("session_not_open", "early")
    assert created["type"] == "session.created" and created["session_id"] == created["session"]["id"]
    assert created["session"]["instructions"] == "be a mirror" and "capabilities" in created["session"]
    assert (echoed["format"], echoed["sample_rate_hz"], echoed["session_id"]) == ("pcm16", 24000, created["session_id"])
    assert tail[-1]["type"] == "session.closed"
