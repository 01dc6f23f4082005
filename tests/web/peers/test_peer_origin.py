"""What a relayed socket shows the session's owner of the client's request: the path, query
and dialect headers, never the API key (this front-end checked it)."""

from __future__ import annotations

from aiohttp.test_utils import make_mocked_request

from rtserve.web.peers import Origin


def test_the_owner_sees_the_clients_dialect_but_not_its_key() -> None:
    request = make_mocked_request(
        "GET",
        "/v1/realtime?duplex=1&api_key=sk-secret&session_id=duplex-x&autostart=0",
        headers={
            "Sec-WebSocket-Protocol": "realtime, openai-insecure-api-key.sk-secret, openai-beta.realtime-v1",
            "OpenAI-Beta": "realtime=v1",
            "Authorization": "Bearer sk-secret",
            "Cookie": "a=b",
        },
    )
    origin = Origin.of(request)
    assert origin.path_qs == "/v1/realtime?duplex=1&session_id=duplex-x&autostart=0"
    assert origin.protocols == ("realtime", "openai-beta.realtime-v1")
    assert dict(origin.headers) == {"OpenAI-Beta": "realtime=v1"}
