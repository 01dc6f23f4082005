"""The body of ``POST /v1/realtime/calls``: an SDP offer, and optionally a session object.

Two shapes, both read within the JSON body bound (``http.max_json_body_bytes``) and the
body deadline of every HTTP route:

* ``Content-Type: application/sdp``: the raw offer, as browsers post it;
* ``multipart/form-data`` with an ``sdp`` part and a JSON ``session`` part, as the
  official ``openai`` SDK's ``client.realtime.calls.create(sdp=..., session=...)`` sends.

The offer is checked for what a call needs (an ``m=audio`` section) before any peer
connection exists; every refusal is a typed 400 naming ``sdp`` or ``session``.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
from dataclasses import dataclass
from email.message import Message
from typing import Any

from aiohttp import web
from aiortc import sdp as aiortc_sdp

from rtserve import errors
from rtserve.web.context import CTX
from rtserve.web.errors import ApiError
from rtserve.web.http.common import read_body


@dataclass(frozen=True)
class CallOffer:
    sdp: str
    session: dict[str, Any] | None  # the client's session object, validated when the session opens


def invalid_sdp(message: str) -> ApiError:
    return ApiError(message, code=errors.INVALID_SDP, param="sdp")


def check_sdp(sdp: str) -> str:
    """The offer, if it is an SDP session description with an audio section."""
    lines = [line.strip() for line in sdp.replace("\r\n", "\n").split("\n") if line.strip()]
    if not lines or lines[0] != "v=0":
        raise invalid_sdp("The body is not an SDP offer (it must start with 'v=0').")
    if not any(line.startswith("m=audio ") for line in lines):
        raise invalid_sdp("The SDP offer has no audio section (m=audio): a call needs the microphone track.")
    # aiortc accepts an offer without these and only fails later, inside the connection.
    for attribute in ("a=ice-ufrag:", "a=ice-pwd:", "a=fingerprint:"):
        if not any(line.startswith(attribute) for line in lines):
            raise invalid_sdp(
                f"The SDP offer has no '{attribute[:-1]}' line (ICE credentials and the DTLS fingerprint are required)."
            )
    text = "\r\n".join(lines) + "\r\n"
    # aiortc's own parser, before any session or peer connection exists: it asserts, indexes and
    # converts its way through each line, so a malformed line raises whatever it hits first
    # (AssertionError, ValueError, IndexError, KeyError, ...); none of that text reaches the client.
    try:
        description = aiortc_sdp.SessionDescription.parse(text)
    except Exception:  # noqa: BLE001 - every failure of this pure parser is a malformed offer
        raise invalid_sdp(
            "The SDP offer is malformed: a line does not follow the SDP grammar "
            "(RFC 8866, RFC 8839 for ICE, RFC 8122 for fingerprints)."
        ) from None
    # aiortc's peer connection trusts what its parser let through: a section without its own
    # mid, ICE credentials or DTLS fingerprint breaks it midway (AttributeError, and a
    # connect task failing in the background), so each is required here, per section.
    mids = [media.rtp.muxId for media in description.media]
    if not mids or any(not mid for mid in mids) or len(set(mids)) != len(mids):
        raise invalid_sdp("Each media section of the SDP offer needs its own 'a=mid' line.")
    for group in description.group:  # aiortc bundles every section on the transport of the group's first
        if group.semantic == "BUNDLE" and sorted(map(str, group.items)) != sorted(mids):
            raise invalid_sdp("The SDP offer's 'a=group:BUNDLE' line must name each media section's mid.")
    for media in description.media:
        if (
            media.dtls is None
            or not media.dtls.fingerprints
            or media.ice is None
            or not media.ice.usernameFragment
            or not media.ice.password
        ):
            raise invalid_sdp(f"The SDP offer's '{media.kind}' section has no ICE credentials or DTLS fingerprint.")
        if media.kind in ("audio", "video") and media.direction is None:
            raise invalid_sdp(f"The SDP offer's '{media.kind}' section has no direction (a=sendrecv, ...).")
    return text


async def read_offer(request: web.Request) -> CallOffer:
    config = request.app[CTX].config
    body = await read_body(request, min(config.http.max_json_body_bytes, config.transport.max_http_body_bytes))
    if request.content_type == "multipart/form-data":
        return _multipart(request.headers.get("Content-Type", ""), body)
    if request.content_type in ("application/sdp", "text/plain", "application/octet-stream"):
        return CallOffer(check_sdp(_text(body, "sdp")), None)
    raise ApiError(
        "Send the SDP offer as application/sdp, or as multipart/form-data with an 'sdp' part.",
        code=errors.INVALID_SDP,
        param="sdp",
        status=415,
    )


def _text(raw: bytes, param: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(f"'{param}' is not UTF-8 text.", code=errors.INVALID_VALUE, param=param) from None


def _multipart(content_type: str, body: bytes) -> CallOffer:
    # The standard library's MIME parser: the body is already read and bounded.
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1", "replace") + b"\r\n\r\n" + body
    )
    parts: dict[str, Message] = {}
    if message.is_multipart():
        for part in message.iter_parts():  # type: ignore[attr-defined]
            name = part.get_param("name", header="content-disposition")
            if isinstance(name, str) and name not in parts:
                parts[name] = part
    if "sdp" not in parts:
        raise invalid_sdp("The multipart body has no 'sdp' part.")
    sdp = check_sdp(_text(parts["sdp"].get_payload(decode=True) or b"", "sdp"))
    session = None
    if "session" in parts:
        try:
            session = json.loads(parts["session"].get_payload(decode=True) or b"")
        except (ValueError, RecursionError):
            raise ApiError("The 'session' part is not valid JSON.", code=errors.INVALID_JSON, param="session") from None
        if not isinstance(session, dict):
            raise ApiError("'session' must be a JSON object.", code=errors.INVALID_VALUE, param="session")
    return CallOffer(sdp, session)
