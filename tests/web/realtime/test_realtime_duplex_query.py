"""The session part of a duplex connection's URL (vLLM-Omni, docs/sessions.md#connection-url; issue
16), over raw aiohttp WebSockets on 127.0.0.1 (no SDK speaks this dialect):
``?session_id=`` names the session a connection opens, ``?session_id=&resume=`` takes a
detached (or attached) session over on a new socket, and bad values are typed errors."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from rtserve.config import ServerConfig
from tests.web.realtime_support import (
    b64_pcm16,
    closing_codes,
    frame_tag,
    loopback_config,
    pcm16_b64,
    read_to_close,
    read_until,
    receive_event,
    running,
    tagged_frame,
    ws_url,
)


def echoed(events: list[dict[str, Any]], tag: int) -> bool:
    """The loopback returned the frame tagged ``tag`` (GA or native audio delta)."""
    return any(
        e["type"].endswith("audio.delta") and frame_tag(b64_pcm16(e.get("delta") or e["audio"])) == tag for e in events
    )


async def refusal(ws: aiohttp.ClientWebSocketResponse) -> tuple[dict[str, Any], int | None]:
    """The error a refused connection gets, and the code the server then closes it with."""
    error = await receive_event(ws)
    assert error is not None and error["type"] == "error", error
    rest = await read_to_close(ws)
    assert rest == [], rest
    return error["error"], closing_codes.get(ws)


@pytest.mark.parametrize("path", ["/v1/realtime", "/v1/duplex"])
async def test_resume_by_query_replays_rotates_and_replaces(config: ServerConfig, path: str) -> None:
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        old = await http.ws_connect(ws_url(base, path, duplex="1", autostart="1"))
        created = await receive_event(old)
        assert created is not None
        session_id, token = created["session"]["id"], created["resume_token"]
        seen = await read_until(old, lambda e: e["type"].endswith("audio.delta"))
        last_seq = seen[-1]["server_event_seq"]
        for tag in (32, 33):  # sent on the old socket, read from the new one
            await old.send_json({"type": "input_audio_buffer.append", "audio": pcm16_b64(tagged_frame(tag))})

        url = ws_url(
            base, path, duplex="1", session_id=session_id, resume=token, last_received_server_event_seq=str(last_seq)
        )
        async with http.ws_connect(url) as new:
            resumed = await receive_event(new)
            assert resumed is not None
            replay = await read_until(new, lambda e: echoed([e], 33))
            replaced = await read_to_close(old)
            await new.send_json({"type": "session.heartbeat"})
            ack = (await read_until(new, "session.heartbeat_ack"))[-1]
    assert created["type"] == "session.created"
    assert resumed["type"] == "session.resumed" and resumed["session_id"] == session_id
    assert resumed["attachment_generation"] == 1 and resumed["resume_token"] not in (None, "", token)
    assert next(e["server_event_seq"] for e in replay) == last_seq + 1  # the replay starts where the client was
    assert echoed(replay, 32) and echoed(replay, 33)
    assert replaced[-1]["type"] == "session.replaced" and replaced[-1]["attachment_generation"] == 1
    assert closing_codes[old] == aiohttp.WSCloseCode.OK
    assert ack["session_id"] == session_id


async def test_resume_by_query_with_old_or_wrong_credentials_is_refused(config: ServerConfig) -> None:
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, duplex="1")) as first:
            created = await receive_event(first)
            assert created is not None
            session_id, token = created["session"]["id"], created["resume_token"]
            async with http.ws_connect(ws_url(base, duplex="1", session_id=session_id, resume=token)) as second:
                resumed = await receive_event(second)
                assert resumed is not None
                await read_to_close(first)
                async with http.ws_connect(ws_url(base, duplex="1", session_id=session_id, resume=token)) as stale:
                    old_token = await refusal(stale)
                async with http.ws_connect(
                    ws_url(base, duplex="1", session_id=session_id, resume="not-a-token")
                ) as wrong:
                    wrong_token = await refusal(wrong)
                async with http.ws_connect(
                    ws_url(base, duplex="1", session_id="duplex-missing", resume=resumed["resume_token"])
                ) as missing:
                    no_session = await refusal(missing)
                await second.send_json({"type": "input_audio_buffer.append", "audio": pcm16_b64(tagged_frame(41))})
                await read_until(second, lambda e: echoed([e], 41))  # the owner is untouched
    assert old_token == (
        {
            "type": "invalid_request_error",
            "code": "session_resume_conflict",
            "message": old_token[0]["message"],
            "event_id": None,
            "param": None,
        },
        aiohttp.WSCloseCode.POLICY_VIOLATION,
    )
    assert wrong_token[0]["code"] == no_session[0]["code"] == "unknown_session"
    assert wrong_token[0]["message"] == no_session[0]["message"]  # no existence oracle
    assert wrong_token[1] == no_session[1] == aiohttp.WSCloseCode.POLICY_VIOLATION


async def test_session_id_query_names_the_session_and_a_held_name_is_refused(config: ServerConfig) -> None:
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        # The PersonaPlex e2e driver's flow: autostart=0, session_id in the URL, then session.update.
        async with http.ws_connect(ws_url(base, duplex="1", autostart="0", session_id="personaplex-primary-1")) as ws:
            await ws.send_json(
                {
                    "type": "session.update",
                    "session": {"session_id": "personaplex-primary-1", "instructions": "You are a teacher."},
                }
            )
            created = (await read_until(ws, "session.created"))[-1]
            async with http.ws_connect(ws_url(base, duplex="1", session_id="personaplex-primary-1")) as twin:
                taken = await refusal(twin)
            await ws.send_json({"type": "session.close"})
            await read_to_close(ws)
        # Once the session is gone its name is free again.
        async with http.ws_connect(
            ws_url(base, "/v1/duplex", autostart="1", session_id="personaplex-primary-1")
        ) as again:
            reopened = await receive_event(again)
            assert reopened is not None
        async with http.ws_connect(ws_url(base, session_id="turn-based-name")) as plain:
            turn_based = await receive_event(plain)
            assert turn_based is not None
    assert created["session"]["id"] == "personaplex-primary-1"
    assert taken == (
        {
            "type": "invalid_request_error",
            "code": "session_exists",
            "message": taken[0]["message"],
            "event_id": None,
            "param": None,
        },
        aiohttp.WSCloseCode.POLICY_VIOLATION,
    )
    assert reopened["session"]["id"] == "personaplex-primary-1"
    assert turn_based["type"] == "session.created" and turn_based["session"]["id"] != "turn-based-name"


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"duplex": "1", "session_id": "has spaces"}, "session_id"),
        ({"duplex": "1", "session_id": "x" * 200}, "session_id"),
        ({"duplex": "1", "resume": "tok"}, "session_id"),
        ({"duplex": "1", "session_id": "duplex-a", "resume": ""}, "resume"),
        (
            {"duplex": "1", "session_id": "duplex-a", "resume": "tok", "last_received_server_event_seq": "-1"},
            "last_received_server_event_seq",
        ),
        (
            {"duplex": "1", "session_id": "duplex-a", "resume": "tok", "attachment_generation": "one"},
            "attachment_generation",
        ),
        ({"resume": "tok", "session_id": "duplex-a"}, "resume"),  # a turn-based connection cannot resume
    ],
)
async def test_bad_session_query_values_are_typed_errors(
    config: ServerConfig, query: dict[str, str], param: str
) -> None:
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, **query)) as ws:
            error, code = await refusal(ws)
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "invalid_value", param)
    assert code == aiohttp.WSCloseCode.POLICY_VIOLATION


async def test_client_session_ids_off_allocates_server_ids(config: ServerConfig) -> None:
    async with running(loopback_config(config, client_session_ids=False)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, duplex="1", session_id="mine")) as ws:
            created = await receive_event(ws)
            assert created is not None
    assert created["session"]["id"].startswith("duplex-")
