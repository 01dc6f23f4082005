"""OpenAI-shaped HTTP error bodies: ``{"error": {"message", "type", "param", "code"}}``.

Every client-visible error goes through here, so no traceback or internal path can reach
a client. ``error_middleware`` turns anything unexpected into a plain 500.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from rtserve.errors import RtserveError

log = logging.getLogger(__name__)

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    409: "invalid_request_error",
    429: "rate_limit_error",
    501: "server_error",
    503: "server_error",
}


def error_body(
    message: str, *, status: int = 400, code: str | None = None, param: str | None = None, type_: str | None = None
) -> dict[str, dict[str, str | None]]:
    return {
        "error": {
            "message": message,
            "type": type_ or _TYPE_BY_STATUS.get(status, "server_error"),
            "param": param,
            "code": code,
        }
    }


def error_response(
    message: str,
    *,
    status: int = 400,
    code: str | None = None,
    param: str | None = None,
    type_: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    return web.json_response(
        error_body(message, status=status, code=code, param=param, type_=type_), status=status, headers=headers
    )


class ApiError(RtserveError):
    """Raised by a handler to answer with an OpenAI-shaped error (``error_middleware`` renders it)."""

    code: str | None = None  # type: ignore[assignment]  # OpenAI bodies may carry "code": null

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        code: str | None = None,
        param: str | None = None,
        type_: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, code=code, param=param)
        self.status = status
        self.type_ = type_
        self.headers = headers

    def body(self) -> dict[str, dict[str, str | None]]:
        return error_body(self.message, status=self.status, code=self.code, param=self.param, type_=self.type_)

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status, headers=self.headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response()
    except web.HTTPException as exc:
        if exc.status < 400 or exc.content_type == "application/json":
            raise
        # aiohttp's own 404/405/413 pages become OpenAI-shaped bodies.
        reason = exc.reason or "error"
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status)
        return error_response(
            reason, status=exc.status, code=code, headers={k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        )
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response("Internal server error", status=500, code="internal_error", type_="server_error")
