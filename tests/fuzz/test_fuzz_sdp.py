"""Fuzzing ``POST /v1/realtime/calls`` through the real socket: raw SDP bodies (random text
and bytes, a real aiortc offer mutated line by line: lines dropped, duplicated, garbled,
bad DTLS fingerprints, huge values, non-UTF-8 bytes), under right and wrong content types,
and the SDK's multipart shape with a random ``session`` JSON part. Every refusal is a 4xx
with a typed error body (a catalogued code, no internal text) and leaves no call and no
session behind (``/metrics``); an offer that still makes a call is hung up and must go away
too. The log stays clean; the canary session opened before keeps echoing; RSS stays
bounded. Every ICE candidate is on 127.0.0.1 (``webrtc.host_addresses``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtserve import errors
from rtserve.app import build_app
from tests.fuzz.fuzz_support import FUZZ, WAIT_S, FuzzServer, check_error, fuzz_config, fuzz_server
from tests.fuzz.strategies import json_values
from tests.web.webrtc_support import Caller

pytestmark = pytest.mark.timeout(240)

CALLS = "/v1/realtime/calls"
# Many mutated and most multipart offers place a real call (ICE gathering, then a hangup): half the examples
# keeps the module near 30 s.
CALL_FUZZ = settings(FUZZ, max_examples=max(1, FUZZ.max_examples // 2))
CODES = {value for name, value in vars(errors).items() if name.isupper() and isinstance(value, str)}

# One line edit: (operation, which line, payload). Applied to the offer's lines in order.
_huge = st.sampled_from([9, 10_000, 70_000]).map(lambda n: "9" * n)
_fingerprints = st.sampled_from(
    [
        "a=fingerprint:",
        "a=fingerprint:sha-256",
        "a=fingerprint:sha-256 zz:zz",
        "a=fingerprint:md5 00:11",
        "a=fingerprint:sha-256 " + "AB:" * 5000,
        "a=fingerprint: sha-256",
        "a=fingerprint:sha-999 00",
    ]
)
_edits = st.lists(
    st.one_of(
        st.tuples(st.just("drop"), st.integers(0, 200), st.just("")),
        st.tuples(st.just("duplicate"), st.integers(0, 200), st.just("")),
        st.tuples(st.just("garble"), st.integers(0, 200), st.text(max_size=40)),
        st.tuples(
            st.just("value"),
            st.integers(0, 200),
            _huge
            | st.text(max_size=20)
            | st.sampled_from(["-1", "0", "65536", "2" * 30, "nan", "", " ", "audio", "UDP/TLS/RTP/SAVPF 0"]),
        ),
        st.tuples(st.just("fingerprint"), st.integers(0, 200), _fingerprints),
        st.tuples(st.just("bytes"), st.integers(0, 200), st.binary(min_size=1, max_size=8)),
    ),
    min_size=1,
    max_size=4,
)
_raw_types = st.sampled_from(
    [
        "application/sdp",
        "application/sdp",
        "text/plain",
        "application/octet-stream",
        "application/sdp; charset=latin-1",
        "application/json",
        "",
        "multipart/form-data",
        "application/x-www-form-urlencoded",
    ]
)
_session_parts = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["realtime", "transcription"]) | json_values(),
            "model": st.sampled_from(["loopback", "gpt-realtime"]) | json_values(),
            "instructions": st.text(max_size=40) | json_values(),
            "output_modalities": st.lists(st.sampled_from(["audio", "text", "x"]), max_size=3) | json_values(),
            "audio": st.fixed_dictionaries({}, optional={"input": json_values(), "output": json_values()})
            | json_values(),
            "tools": json_values(),
            "max_output_tokens": st.integers(-5, 2**70) | json_values(),
            "turn_detection": json_values(),
        },
    ).map(json.dumps),
    json_values().map(json.dumps),
    st.text(max_size=40),
    st.just("[" * 5000),
)


def apply_edits(lines: list[str], edits: list[tuple[str, int, Any]]) -> bytes:
    out: list[bytes] = [line.encode() for line in lines]
    for op, index, payload in edits:
        if not out:
            break
        i = index % len(out)
        if op == "drop":
            del out[i]
        elif op == "duplicate":
            out.insert(i, out[i])
        elif op == "garble":
            out[i] = payload.encode("utf-8", "surrogatepass")
        elif op == "value":  # the text after the line's type (``x=``) or attribute name (``a=name:``)
            head = out[i].split(b":", 1)[0] + b":" if out[i].startswith(b"a=") and b":" in out[i] else out[i][:2]
            out[i] = head + payload.encode("utf-8", "surrogatepass")
        elif op == "fingerprint":
            out = [payload.encode() if line.startswith(b"a=fingerprint:") else line for line in out]
        else:
            out[i] = out[i][: len(out[i]) // 2] + payload + out[i][len(out[i]) // 2 :]
    return b"\r\n".join(out) + b"\r\n"


@pytest.fixture(scope="module")
def server() -> Iterator[FuzzServer]:
    async def make_app():
        return build_app(fuzz_config(webrtc={"host_addresses": ["127.0.0.1"], "max_calls": 64}))

    with fuzz_server(make_app) as running:
        yield running


@pytest.fixture(scope="module")
def offer_lines(server: FuzzServer) -> list[str]:
    """A real browser-shaped offer (audio and the ``oai-events`` data channel), from aiortc."""

    async def make() -> str:
        caller = Caller()
        try:
            return await caller.offer()
        finally:
            await caller.close()

    return server.run(make()).splitlines()


@pytest.fixture(scope="module")
def client(server: FuzzServer) -> Iterator[aiohttp.ClientSession]:
    async def open_client() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(base_url=server.base, timeout=aiohttp.ClientTimeout(total=WAIT_S))

    http = server.run(open_client())
    yield http
    server.run(http.close())


async def _metric(http: aiohttp.ClientSession, name: str) -> float:
    async with http.get("/metrics") as resp:
        text = await resp.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def _nothing_left(http: aiohttp.ClientSession) -> None:
    """No call, and no session but the canary's (a hung-up call's session closes within its grace)."""
    try:
        async with asyncio.timeout(WAIT_S):
            while (
                await _metric(http, "rtserve_webrtc_calls "),
                await _metric(http, "rtserve_sessions_slots_in_use "),
            ) != (0, 1):
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError("a call or session was left behind") from None


async def _place(http: aiohttp.ClientSession, **kwargs: Any) -> tuple[int, str, str | None]:
    async with http.post(CALLS, **kwargs) as resp:
        status, text, location = resp.status, await resp.text(errors="replace"), resp.headers.get("Location")
    if status == 201:  # the offer still made a call: hang it up, it must go away as well
        assert location is not None and text.startswith("v=0")
        async with http.post(f"{location}/hangup") as resp:
            assert resp.status == 200
    await _nothing_left(http)
    return status, text, location


def post(server: FuzzServer, client: aiohttp.ClientSession, **kwargs: Any) -> int:
    status, text, _ = server.run(_place(client, **kwargs))
    assert status < 500, (status, text[:300])
    if status >= 400:
        error = json.loads(text)["error"]
        check_error(error.get("code"), error.get("message"))
        assert error["code"] in CODES, error
    server.assert_clean_log()
    return status


@FUZZ
@given(
    st.one_of(
        st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.binary(max_size=200),
        st.text(max_size=200).map(lambda t: ("v=0\r\n" + t).encode("utf-8", "surrogatepass")),
    ),
    _raw_types,
)
def test_random_bodies_get_a_typed_4xx(
    server: FuzzServer, client: aiohttp.ClientSession, body: bytes, ctype: str
) -> None:
    assert post(server, client, data=body, headers={"Content-Type": ctype}) >= 400


@CALL_FUZZ
@given(_edits, _raw_types)
def test_mutated_offers_get_a_call_or_a_typed_4xx(
    server: FuzzServer,
    client: aiohttp.ClientSession,
    offer_lines: list[str],
    edits: list[tuple[str, int, Any]],
    ctype: str,
) -> None:
    post(server, client, data=apply_edits(offer_lines, edits), headers={"Content-Type": ctype})


@CALL_FUZZ
@given(
    st.none() | _edits,
    st.none() | _session_parts,
    st.sampled_from(["sdp", "SDP", "file"]),
    st.sampled_from([None, "application/sdp", "text/plain; charset=utf-16", "application/json"]),
)
def test_multipart_offers_with_random_sessions_get_a_call_or_a_typed_4xx(
    server: FuzzServer,
    client: aiohttp.ClientSession,
    offer_lines: list[str],
    edits: list[tuple[str, int, Any]] | None,
    session: str | None,
    name: str,
    part_type: str | None,
) -> None:
    form = aiohttp.FormData()
    sdp = "\r\n".join(offer_lines).encode() + b"\r\n" if edits is None else apply_edits(offer_lines, edits)
    form.add_field(name, sdp, content_type=part_type)
    if session is not None:
        form.add_field("session", session.encode("utf-8", "surrogatepass"), content_type="application/json")
    post(server, client, data=form)


def test_zz_afterwards_a_call_is_placed_the_canary_works_the_log_is_clean_and_rss_bounded(
    server: FuzzServer, client: aiohttp.ClientSession, offer_lines: list[str]
) -> None:
    assert (
        post(server, client, data="\r\n".join(offer_lines) + "\r\n", headers={"Content-Type": "application/sdp"}) == 201
    )
    server.assert_healthy_after_fuzzing()
