"""How a realtime connection's dialect is chosen from its route, query and headers."""

from __future__ import annotations

from aiohttp.test_utils import make_mocked_request

from rtserve.engines.values import EngineCapabilities
from rtserve.sessions import NativeDuplexProjection
from rtserve.sessions.projections import RealtimeProjection, TurnBasedProjection
from rtserve.web.realtime.dialect import DUPLEX_ROUTE, REALTIME_ROUTE, accepted_subprotocols, select_dialect

CAPS = EngineCapabilities(
    name="x",
    mode="turn",
    input_sample_rate=16000,
    output_sample_rate=24000,
    chunk_period_ms=40,
    max_sessions=4,
    supports_barge_in=True,
    supports_server_vad=True,
)


def request(path: str, **headers: str):
    return make_mocked_request("GET", path, headers=headers)


def test_defaults_are_turn_based_ga_with_autostart() -> None:
    dialect = select_dialect(request("/v1/realtime?model=m"), REALTIME_ROUTE, CAPS, duplex_enabled=True)
    assert isinstance(dialect.projection, TurnBasedProjection) and dialect.projection.naming == "ga"
    assert (dialect.duplex, dialect.autostart, dialect.conversation_created) == (False, True, True)
    assert dialect.rules.supports_server_vad


def test_duplex_beta_and_autostart_come_from_the_query_or_headers() -> None:
    dialect = select_dialect(
        request("/v1/realtime?duplex=true&api=beta&autostart=0"), REALTIME_ROUTE, CAPS, duplex_enabled=True
    )
    assert isinstance(dialect.projection, RealtimeProjection)
    assert (dialect.duplex, dialect.autostart, dialect.projection.naming) == (True, False, "beta")
    header = request("/v1/realtime", **{"OpenAI-Beta": "realtime=v1"})
    projection = select_dialect(header, REALTIME_ROUTE, CAPS, duplex_enabled=True).projection
    assert isinstance(projection, RealtimeProjection) and projection.naming == "beta"
    browser = request("/v1/realtime", **{"Sec-WebSocket-Protocol": "realtime, openai-beta.realtime-v1"})
    projection = select_dialect(browser, REALTIME_ROUTE, CAPS, duplex_enabled=True).projection
    assert isinstance(projection, RealtimeProjection) and projection.naming == "beta"
    assert not select_dialect(request("/v1/realtime?duplex=1"), REALTIME_ROUTE, CAPS, duplex_enabled=False).duplex


def test_native_route_waits_for_session_create() -> None:
    dialect = select_dialect(request("/v1/duplex"), DUPLEX_ROUTE, CAPS, duplex_enabled=True)
    assert isinstance(dialect.projection, NativeDuplexProjection)
    assert (dialect.duplex, dialect.autostart, dialect.conversation_created) == (True, False, False)


def test_subprotocol_answer_prefers_realtime_and_never_leaves_a_browser_unanswered() -> None:
    key = "openai-insecure-api-key.k"
    assert accepted_subprotocols(request("/", **{"Sec-WebSocket-Protocol": f"{key}, realtime"})) == ("realtime",)
    assert accepted_subprotocols(request("/", **{"Sec-WebSocket-Protocol": key})) == (key,)
    assert accepted_subprotocols(request("/", **{"Sec-WebSocket-Protocol": "chat"})) == ()
    assert accepted_subprotocols(request("/")) == ()
