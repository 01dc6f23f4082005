"""Which protocol a realtime connection speaks, decided at the upgrade.

* Route ``/v1/realtime``: OpenAI Realtime. Turn-based unless ``?duplex=1`` (``1``,
  ``true``, ``on``) asks for the duplex runtime and ``transport.duplex_sessions`` is on;
  otherwise it silently falls back to turn-based (docs/sessions.md#dialects-and-fallback), and clients tell the
  two apart by ``session.created.session.capabilities``, present only on duplex.
* Route ``/v1/duplex``: the native duplex dialect (``NativeDuplexProjection``).
* Event names: GA by default; beta (``response.audio.delta``, ``conversation.item.created``,
  ...) with ``?api=beta``, the header ``OpenAI-Beta: realtime=v1`` or the subprotocol
  ``openai-beta.realtime-v1``.
* ``?native_duplex=`` (vLLM-Omni; alias ``minicpmo45_native_duplex``) states whether the
  client needs a model-native duplex engine (a lockstep model) or a turn engine; a request
  the engine cannot meet is refused (``native_duplex_unavailable``), never ignored.
* ``?autostart=0`` opens no session on connect: the first ``session.update`` opens one
  (answered by ``session.created``) or ``session.resume`` takes over a detached one.
  Default: on for ``/v1/realtime`` (what OpenAI clients expect), off for ``/v1/duplex``
  (whose lifecycle starts with ``session.create``).

"Duplex available" means: every engine runs on the session core's duplex runtime
(lockstep engines continuously, turn engines with barge-in/VAD as their capabilities
say), so it is a deployment switch, ``transport.duplex_sessions``, not an engine property.
"""

from __future__ import annotations

from aiohttp import web

from rtserve.engines.values import EngineCapabilities
from rtserve.sessions import NativeDuplexProjection, RealtimeProjection
from rtserve.sessions.projections import TurnBasedProjection
from rtserve.sessions.projections.realtime import Naming
from rtserve.web.realtime.client_events import EventRules
from rtserve.web.realtime.connection import Dialect
from rtserve.web.subprotocols import key_subprotocols, offered_subprotocols

REALTIME_ROUTE = "/v1/realtime"
DUPLEX_ROUTE = "/v1/duplex"
REALTIME_SUBPROTOCOL = "realtime"
BETA_SUBPROTOCOL = "openai-beta.realtime-v1"
_TRUE = frozenset({"1", "true", "on", "yes"})
_FALSE = frozenset({"0", "false", "off", "no"})


def _flag(request: web.Request, name: str) -> bool | None:
    value = request.query.get(name)
    if value is None:
        return None
    value = value.strip().lower()
    return True if value in _TRUE else False if value in _FALSE else None


def accepted_subprotocols(request: web.Request) -> tuple[str, ...]:
    """Echo ``realtime`` when offered (OpenAI clients refuse a server that does not);
    a browser that offered only its key or the beta marker gets one of those back,
    because a browser fails a handshake whose offered protocols all went unanswered."""
    offered = offered_subprotocols(request)
    if REALTIME_SUBPROTOCOL in offered:
        return (REALTIME_SUBPROTOCOL,)
    return (*key_subprotocols(request), *(p for p in offered if p == BETA_SUBPROTOCOL))


def wants_beta(request: web.Request) -> bool:
    api = request.query.get("api", "").strip().lower()
    if api in ("beta", "v1"):
        return True
    if api == "ga":
        return False
    return "realtime=v1" in request.headers.get("OpenAI-Beta", "").replace(
        " ", ""
    ) or BETA_SUBPROTOCOL in offered_subprotocols(request)


def native_duplex_mismatch(request: web.Request, capabilities: EngineCapabilities) -> str | None:
    """Why ``?native_duplex=`` cannot be met by this engine; None when absent or met."""
    wanted = _flag(request, "native_duplex")
    if wanted is None:
        wanted = _flag(request, "minicpmo45_native_duplex")
    native = capabilities.mode == "lockstep"
    if wanted is None or wanted == native:
        return None
    if wanted:
        return "native_duplex=1 needs a model-native duplex engine; this server runs turns with server VAD"
    return "native_duplex=0 asks for turn-based serving; this server's model is natively full duplex"


def select_dialect(request: web.Request, route: str, capabilities: EngineCapabilities, duplex_enabled: bool) -> Dialect:
    naming: Naming = "beta" if wants_beta(request) else "ga"
    autostart = _flag(request, "autostart")
    vad = capabilities.supports_server_vad
    if route == DUPLEX_ROUTE:
        return Dialect(
            route,
            NativeDuplexProjection(),
            EventRules(duplex=True, supports_server_vad=vad),
            autostart=bool(autostart),
            conversation_created=False,
        )
    if duplex_enabled and _flag(request, "duplex"):
        return Dialect(
            route,
            RealtimeProjection(naming, duplex=True),
            EventRules(duplex=True, supports_server_vad=vad),
            autostart=autostart is not False,
            conversation_created=False,
        )
    return Dialect(
        route,
        TurnBasedProjection(naming),
        EventRules(duplex=False, supports_server_vad=vad),
        autostart=autostart is not False,
        conversation_created=True,
    )
