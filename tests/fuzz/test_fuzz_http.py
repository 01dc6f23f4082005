"""Fuzzing the HTTP generation routes through the real socket: JSON bodies of
``/v1/chat/completions`` (and ``/batch``) and ``/v1/audio/speech`` (schema-shaped with random values, any
JSON, non-JSON, odd content types) and multipart uploads of ``/v1/audio/transcriptions``
(random fields, valid audio mutated, malformed multipart). Every answer is a 2xx or a 4xx
with a typed OpenAI error body, never a 5xx; the log stays clean; a client connected before
keeps being served; RSS stays bounded. The turn engines are the HTTP tests' doubles."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtserve.app import build_app
from tests.fuzz.fuzz_support import FUZZ, WAIT_S, FuzzServer, check_error, fuzz_config, fuzz_server
from tests.fuzz.strategies import json_values, mutated
from tests.web.http_support import TurnEnginesSessionDouble, audio_file

pytestmark = pytest.mark.timeout(240)

WAV = audio_file("wav", "pcm_s16le", 16_000, seconds=0.3)
OGG = audio_file("ogg", "libopus", 48_000, seconds=0.3)
CHAT = {"model": "double-llm", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}

messages = (
    st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "assistant", "developer", "tool", "x"]) | json_values()},
            optional={
                "content": st.text(max_size=40) | json_values(),
                "name": json_values(),
                "tool_calls": json_values(),
            },
        ),
        max_size=4,
    )
    | json_values()
)
chat_bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["double-llm", "gpt-4o", "x"]) | json_values(),
        "messages": messages,
        "temperature": st.floats() | json_values(),
        "top_p": st.floats() | json_values(),
        "max_tokens": st.integers(-5, 2**70) | json_values(),
        "max_completion_tokens": json_values(),
        "n": json_values(),
        "seed": st.integers(-(2**70), 2**70) | json_values(),
        "stop": json_values(),
        "stream": st.booleans() | json_values(),
        "stream_options": json_values(),
        "tools": json_values(),
        "response_format": json_values(),
    },
)
speech_bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["double-tts", "tts-1", "x"]) | json_values(),
        "input": st.text(max_size=60) | json_values(),
        "voice": st.text(max_size=20) | st.fixed_dictionaries({"id": json_values()}) | json_values(),
        "response_format": st.sampled_from(["wav", "pcm", "mp3", "opus", "flac", "aac", "x"]) | json_values(),
        "speed": st.floats() | json_values(),
        "stream_format": st.sampled_from(["audio", "sse"]) | json_values(),
        "instructions": json_values(),
    },
)
content_types = st.sampled_from(
    [
        "application/json",
        "text/plain",
        "application/json; charset=latin-1",
        "multipart/form-data",
        "application/x-www-form-urlencoded",
        "",
    ]
)
form_fields = st.dictionaries(
    st.sampled_from(
        [
            "model",
            "language",
            "prompt",
            "response_format",
            "temperature",
            "stream",
            "timestamp_granularities[]",
            "chunking_strategy",
            "x",
        ]
    ),
    st.text(max_size=20)
    | st.sampled_from(["whisper-1", "json", "text", "verbose_json", "srt", "vtt", "true", "en", "xx", "-1", "nan"]),
    max_size=5,
)
uploads = st.one_of(mutated(WAV), mutated(OGG), st.binary(max_size=300), st.just(WAV), st.just(b""))


@pytest.fixture(scope="module")
def server() -> Iterator[FuzzServer]:
    async def make_app():
        engine = TurnEnginesSessionDouble()
        await engine.start()
        return build_app(fuzz_config(), engine=engine)

    with fuzz_server(make_app, canary=False) as running:
        yield running


async def _post(http: aiohttp.ClientSession, path: str, **kwargs: Any) -> tuple[int, str]:
    async with http.post(path, **kwargs) as resp:
        return resp.status, await resp.text(errors="replace")


@pytest.fixture(scope="module")
def client(server: FuzzServer) -> Iterator[aiohttp.ClientSession]:
    """Kept alive through the module (in the server's loop): the canary client, served before
    and after the fuzzing."""

    async def open_client() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(base_url=server.base, timeout=aiohttp.ClientTimeout(total=WAIT_S))

    http = server.run(open_client())
    assert server.run(_post(http, "/v1/chat/completions", json=CHAT))[0] == 200
    yield http
    server.run(http.close())


def post(server: FuzzServer, client: aiohttp.ClientSession, path: str, **kwargs: Any) -> None:
    status, text = server.run(_post(client, path, **kwargs))
    assert status < 500, (status, text[:300])
    if status >= 400:
        error = json.loads(text)["error"]
        check_error(error.get("code") or error.get("type"), error.get("message"))
    else:
        assert "Traceback" not in text
    server.assert_clean_log()


def form(fields: dict[str, str], upload: bytes, name: str) -> aiohttp.FormData:
    data = aiohttp.FormData()
    for key, value in fields.items():
        data.add_field(key, value)
    data.add_field("file", io.BytesIO(upload), filename=name or None)
    return data


batch_bodies = st.tuples(chat_bodies, st.lists(messages, max_size=3) | json_values()).map(
    lambda t: {**t[0], "messages": t[1]}
)


@FUZZ
@given(
    st.sampled_from(["/v1/chat/completions", "/v1/chat/completions/batch"]),
    st.one_of(
        chat_bodies.map(json.dumps), batch_bodies.map(json.dumps), json_values().map(json.dumps), st.text(max_size=80)
    ),
    content_types,
)
def test_chat_bodies_get_2xx_or_typed_4xx(
    server: FuzzServer, client: aiohttp.ClientSession, path: str, body: str, ctype: str
) -> None:
    post(server, client, path, data=body.encode("utf-8", "surrogatepass"), headers={"Content-Type": ctype})


@FUZZ
@given(st.one_of(speech_bodies.map(json.dumps), json_values().map(json.dumps), st.binary(max_size=80)), content_types)
def test_speech_bodies_get_2xx_or_typed_4xx(
    server: FuzzServer, client: aiohttp.ClientSession, body: str | bytes, ctype: str
) -> None:
    data = body if isinstance(body, bytes) else body.encode("utf-8", "surrogatepass")
    post(server, client, "/v1/audio/speech", data=data, headers={"Content-Type": ctype})


@FUZZ
@given(form_fields, uploads, st.sampled_from(["a.wav", "a.ogg", "", "x" * 300, "../../a"]))
def test_transcription_uploads_get_2xx_or_typed_4xx(
    server: FuzzServer, client: aiohttp.ClientSession, fields: dict[str, str], upload: bytes, name: str
) -> None:
    post(server, client, "/v1/audio/transcriptions", data=form(fields, upload, name))


@FUZZ
@given(
    st.binary(max_size=400),
    st.sampled_from(
        [
            "multipart/form-data; boundary=xyz",
            "multipart/form-data",
            "multipart/form-data; boundary=",
            "multipart/mixed; boundary=a",
        ]
    ),
)
def test_malformed_multipart_gets_a_typed_4xx(
    server: FuzzServer, client: aiohttp.ClientSession, body: bytes, ctype: str
) -> None:
    framed = b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n' + body
    for data in (body, framed):
        post(server, client, "/v1/audio/transcriptions", data=data, headers={"Content-Type": ctype})


def test_zz_afterwards_the_client_is_served_the_log_is_clean_and_rss_bounded(
    server: FuzzServer, client: aiohttp.ClientSession
) -> None:
    assert server.run(_post(client, "/v1/chat/completions", json=CHAT))[0] == 200
    server.assert_healthy_after_fuzzing()
