"""``WS /v1/realtime/robot/openpi`` (and WebSocket upgrades at ``/``): openpi-compatible
robot policy serving (docs/serving.md#robot-policy).

Protocol (binary MessagePack frames, numpy markers: see ``wire``):

* on connect the server sends the policy's server config (the handshake/metadata);
* ``{"endpoint": "infer", "session_id": ..., "seed": ..., **observation}`` (``endpoint``,
  ``session_id`` and ``seed`` may be omitted; see ``request``) -> the policy's action dict
  plus ``server_timing`` (``infer_ms``: receipt to result, ``queue_ms``, ``batch_size``,
  ``prev_total_ms``: the previous request's receipt-to-sent time) and ``policy_timing``
  (``infer_ms``: the batched policy call);
* ``{"endpoint": "reset"}`` -> ``{"status": "reset successful"}``.

The first inference of a session, a changed ``session_id`` or a reset reaches the policy
with ``reset=True``. Session ids are scoped to the connection (two robots both using
``"default"`` never share policy state). An omitted ``session_id`` keeps the current one.
``seed`` reaches the policy with the request (``PolicyRequest.seed``).

Errors. Every error answering a request is a TEXT frame holding a JSON object
``{"type": "error", "message": ..., "code": ...}`` (plus ``detail`` for
``invalid_payload``), never a binary frame. The reason is the clients' code: openpi-client's
``WebsocketClientPolicy.infer()`` and vLLM-Omni's DreamZero example both raise on a text
frame and return any binary frame, decoded, as actions, so a MessagePack error dict would
reach a robot loop as if it were actions. Upstream's ``WebsocketPolicyServer`` does the
same (its text frame is a traceback; ours is the message only). The one MessagePack error
left is the handshake's ``Robot policy not available`` (``routes``): both clients decode
the first frame as MessagePack, so that is where they can read it.

* ``Internal inference error`` (``inference_error``, the policy failed): the text frame,
  then close 1011, as upstream, so the robot stops on it;
* ``Invalid request payload`` (``invalid_payload``, with a ``detail``) for frames that are
  not valid openpi messages, text frames included; the policy's message naming the key for
  a bad observation (``invalid_observation``, NaN/Inf included); ``overloaded`` when the
  request queue is full: the text frame, and the connection stays open, so a client that
  catches the error can fix the request or retry without reconnecting.

Frames over ``robot.max_message_bytes`` close the socket with 1009; no data frame for
``robot.idle_timeout_s`` closes it with 1000.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid

from aiohttp import WSCloseCode, WSMsgType, web

from rtserve.engines.errors import EngineError
from rtserve.engines.policy.batcher import PolicyBatcher
from rtserve.engines.policy.errors import PolicyInferenceError
from rtserve.engines.values import PolicyRequest
from rtserve.errors import RtserveError
from rtserve.web.codec_executor import CodecExecutor
from rtserve.web.connections import close_socket
from rtserve.web.error_mapping import OPENPI_INFERENCE_ERROR, openpi_error_frame
from rtserve.web.openpi.metrics import OpenPIMetrics
from rtserve.web.openpi.request import OpenPIRequest, parse_request
from rtserve.web.openpi.wire import OpenPIFrameError, pack_message, unpack_message

log = logging.getLogger(__name__)

_DEFAULT_SESSION = "default"
_INLINE_DECODE_BYTES = 1 << 20  # larger frames decode on the codec executor, off the event loop


class OpenPIConnection:
    """One robot connection: strict request/response, one request in flight."""

    def __init__(
        self,
        ws: web.WebSocketResponse,
        batcher: PolicyBatcher,
        metrics: OpenPIMetrics,
        codecs: CodecExecutor,
        idle_timeout_s: float,
    ) -> None:
        self._ws = ws
        self._batcher = batcher
        self._metrics = metrics
        self._codecs = codecs
        self._idle_timeout_s = idle_timeout_s
        self.connection_id = uuid.uuid4().hex[:12]
        self._session: str | None = None  # the client's session id; None -> next infer resets
        self._session_fresh = True  # no successful inference yet in the current session
        self._prev_total_ms: float | None = None

    def _policy_key(self, session_id: str) -> str:
        return f"{self.connection_id}/{session_id}"

    async def run(self) -> None:
        self._batcher.client_connected()
        try:
            await self._ws.send_bytes(pack_message(self._batcher.policy.server_config()))
            while True:
                try:
                    async with asyncio.timeout(self._idle_timeout_s):
                        msg = await self._ws.receive()
                except TimeoutError:
                    log.info("closing idle openpi connection after %.1f s", self._idle_timeout_s)
                    self._metrics.errors.labels("idle_timeout").inc()
                    await self._ws.close(code=WSCloseCode.OK, message=b"idle timeout")
                    return
                if msg.type is WSMsgType.BINARY:
                    await self._on_frame(msg.data)
                elif msg.type is WSMsgType.TEXT:
                    await self._send_error(
                        OpenPIFrameError("text frames are not observations; send binary MessagePack frames")
                    )
                elif msg.type is WSMsgType.ERROR:
                    # aiohttp already closed the socket (1009 for an oversized frame).
                    too_big = self._ws.close_code == WSCloseCode.MESSAGE_TOO_BIG
                    self._metrics.errors.labels("message_too_big" if too_big else "protocol_error").inc()
                    log.info("openpi connection closed: %s", msg.data)
                    return
                else:  # close / closing / closed
                    return
        finally:
            self._batcher.client_disconnected()
            if self._session is not None:
                self._batcher.reset_session(self._policy_key(self._session))

    async def _send_error(self, exc: RtserveError) -> None:
        self._metrics.errors.labels(exc.code).inc()
        await self._ws.send_str(json.dumps(openpi_error_frame(exc)))
        if exc.code == PolicyInferenceError.code:
            await close_socket(self._ws, WSCloseCode.INTERNAL_ERROR, OPENPI_INFERENCE_ERROR)

    async def _on_frame(self, frame: bytes) -> None:
        received_at = time.perf_counter()
        try:
            if len(frame) > _INLINE_DECODE_BYTES:
                message = await self._codecs.run(unpack_message, frame)
            else:
                message = unpack_message(frame)
            request = parse_request(message)
        except OpenPIFrameError as exc:
            await self._send_error(exc)
            return
        self._metrics.requests.labels(request.endpoint).inc()
        if request.endpoint == "reset":
            self._reset()
            await self._ws.send_bytes(pack_message({"status": "reset successful"}))
        else:
            await self._infer(request, received_at)

    def _reset(self) -> None:
        if self._session is not None:
            self._batcher.reset_session(self._policy_key(self._session))
        self._session = None

    def _enter_session(self, session_id: str) -> None:
        if session_id != self._session:
            self._reset()
            self._session = session_id
            self._session_fresh = True

    async def _infer(self, request: OpenPIRequest, received_at: float) -> None:
        session_id = request.session_id or self._session or _DEFAULT_SESSION
        self._enter_session(session_id)
        observation = request.observation
        try:
            self._batcher.policy.validate(observation)
        except EngineError as exc:
            await self._send_error(exc)
            return
        except Exception:
            log.exception("policy validate() raised an unexpected error")
            await self._send_error(PolicyInferenceError("policy failed"))
            return
        policy_request = PolicyRequest(
            self._policy_key(session_id), observation, reset=self._session_fresh, seed=request.seed
        )
        try:
            result = await self._batcher.infer(policy_request)
        except EngineError as exc:  # overloaded, stopping
            await self._send_error(exc)
            return
        self._session_fresh = False
        server_timing = {
            "infer_ms": (time.perf_counter() - received_at) * 1000,
            "queue_ms": result.queue_ms,
            "batch_size": result.batch_size,
        }
        if self._prev_total_ms is not None:
            server_timing["prev_total_ms"] = self._prev_total_ms
        policy_timing = result.actions.get("policy_timing")
        response = {
            **result.actions,
            "server_timing": server_timing,
            "policy_timing": {
                **(policy_timing if isinstance(policy_timing, dict) else {}),
                "infer_ms": result.infer_ms,
            },
        }
        try:
            frame = pack_message(response)
        except (TypeError, ValueError, OverflowError) as exc:
            log.error("policy output cannot be sent: %s", exc)
            await self._send_error(PolicyInferenceError("policy failed"))
            return
        await self._ws.send_bytes(frame)
        self._prev_total_ms = (time.perf_counter() - received_at) * 1000
        self._metrics.request_seconds.observe(self._prev_total_ms / 1000)
