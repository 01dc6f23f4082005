"""OpenAI-shaped HTTP error bodies: ``{"error": {"message", "type", "param", "code"}}``.

Every client-visible error goes through here, so no traceback or internal path can reach
a client. ``error_middleware`` turns anything unexpected into a plain 500.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from rtserve import errors
from rtserve.errors import RtserveError

log = logging.getLogger(__name__)

_TYPE_BY_STATUS = {
    400: errors.INVALID_REQUEST_ERROR,
    401: errors.AUTHENTICATION_ERROR,
    404: errors.NOT_FOUND_ERROR,
    405: errors.INVALID_REQUEST_ERROR,
    413: errors.INVALID_REQUEST_ERROR,
    422: errors.INVALID_REQUEST_ERROR,
    409: errors.INVALID_REQUEST_ERROR,
    429: errors.RATE_LIMIT_ERROR,
    501: errors.SERVER_ERROR,
    503: errors.SERVER_ERROR,
}


def error_body(
    message: str, *, status: int = 400, code: str | None = None, param: str | None = None, type_: str | None = None
) -> dict[str, dict[str, str | None]]:
    return {
        "error": {
            "message": message,
            "type": type_ or _TYPE_BY_STATUS.get(status, errors.SERVER_ERROR),
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
        code = {404: errors.NOT_FOUND, 405: errors.METHOD_NOT_ALLOWED, 413: errors.REQUEST_TOO_LARGE}.get(exc.status)
        return error_response(
            reason, status=exc.status, code=code, headers={k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        )
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(
            "Internal server error", status=500, code=errors.INTERNAL_ERROR, type_=errors.SERVER_ERROR
        )
