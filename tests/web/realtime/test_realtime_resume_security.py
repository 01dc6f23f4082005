"""``session.resume`` refuses anyone without the session's credentials (issue 17, item 1):
a repeated control ``event_id`` is no key, and a live session that cannot be resumed answers
exactly like one that does not exist (no existence oracle)."""

from __future__ import annotations

import asyncio

import aiohttp

from rtserve.config import ServerConfig
from tests.web.realtime_support import (
    echoed_tags,
    loopback_config,
    pcm16_b64,
    read_until,
    receive_event,
    running,
    tagged_frame,
    ws_url,
)


def resume_event(session_id: str, token: str, generation: int, event_id: str = "resume-1") -> dict:
    return {
        "type": "session.resume",
        "event_id": event_id,
        "session_id": session_id,
        "resume_token": token,
        "attachment_generation": generation,
    }


async def test_a_wrong_token_repeating_the_owners_event_id_is_refused(config: ServerConfig) -> None:
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        first = await http.ws_connect(ws_url(base, duplex="1"))
        created = await receive_event(first)
        assert created is not None
        session_id = created["session"]["id"]
        await first.close()
        async with http.ws_connect(ws_url(base, duplex="1", autostart="0")) as owner:
            await owner.send_json(resume_event(session_id, created["resume_token"], 0))
            resumed = await receive_event(owner)
            assert resumed is not None
            assert resumed["type"] == "session.resumed"
            async with http.ws_connect(ws_url(base, duplex="1", autostart="0")) as intruder:
                for generation in (0, 1):
                    await intruder.send_json(resume_event(session_id, "guessed-token", generation))
                    refused = await receive_event(intruder)
                    assert refused is not None
                    assert refused["type"] == "error" and refused["error"]["code"] == "unknown_session"
                await intruder.send_json({"type": "session.close"})  # it holds no session to close
                not_open = await receive_event(intruder)
                assert not_open is not None and not_open["error"]["code"] == "session_not_open"
            await owner.send_json({"type": "input_audio_buffer.append", "audio": pcm16_b64(tagged_frame(31))})
            seen = await read_until(owner, lambda e: 31 in echoed_tags([e]))
    assert not {"session.replaced", "session.closed", "session.resumed"} & {e["type"] for e in seen}


async def test_a_live_turn_based_session_id_answers_like_an_unknown_one(config: ServerConfig) -> None:
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base)) as turn_based:
            live = await receive_event(turn_based)
            assert live is not None
            live_id = live["session"]["id"]
            async with http.ws_connect(ws_url(base, duplex="1")) as duplex:
                opened = await receive_event(duplex)
                assert opened is not None
                duplex_id = opened["session"]["id"]
                answers = []
                for session_id in (live_id, "sess_" + "0" * 24, duplex_id):
                    async with http.ws_connect(ws_url(base, duplex="1", autostart="0")) as prober:
                        await prober.send_json(resume_event(session_id, "guessed-token", 3))
                        answer = await asyncio.wait_for(receive_event(prober), 5)
                        assert answer is not None
                        answers.append({k: v for k, v in answer.items() if k != "event_id"})  # the server's own id
    assert answers[0]["error"]["code"] == "unknown_session"
    assert answers[0] == answers[1] == answers[2]
