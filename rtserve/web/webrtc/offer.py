"""The body of ``POST /v1/realtime/calls``: an SDP offer, and optionally a session object.

Two shapes, both read within the JSON body bound (``http.max_json_body_bytes``) and the
body deadline of every HTTP route:

* ``Content-Type: application/sdp``: the raw offer, as browsers post it;
* ``multipart/form-data`` with an ``sdp`` part and a JSON ``session`` part, as the
  official ``openai`` SDK's ``client.realtime.calls.create(sdp=..., session=...)`` sends.
  Read part by part as it arrives (aiohttp's multipart reader: header lines and counts
  bounded, linear in the body), at most ``webrtc.max_offer_parts`` parts: a body of
  thousands of empty parts costs nothing but the parts it is allowed.

The offer is at most ``webrtc.max_sdp_bytes`` and is checked for what a call needs (one
``m=audio`` section; at most one section of each kind a call can use) before any peer
connection exists, so the SDP parser never runs over more than a few kilobytes on the
event loop; every refusal is a typed 400 (413 for size) naming ``sdp`` or ``session``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import BodyPartReader, MultipartReader, hdrs, web
from aiohttp.http_exceptions import BadHttpMessage
from aiortc import sdp as aiortc_sdp

from rtserve import errors, untrusted_json
from rtserve.web.context import CTX
from rtserve.web.errors import ApiError
from rtserve.web.http.common import body_deadline, body_too_large, read_body, reject_oversized

# The media sections a call can use, at most one of each: the microphone (required), the
# ``oai-events`` data channel, and a camera.
_CALL_MEDIA_KINDS = ("audio", "application", "video")


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
    kinds = [line[2:].split(" ", 1)[0] for line in lines if line.startswith("m=")]
    if "audio" not in kinds:
        raise invalid_sdp("The SDP offer has no audio section (m=audio): a call needs the microphone track.")
    for kind in set(kinds):
        if kind not in _CALL_MEDIA_KINDS or kinds.count(kind) > 1:
            raise invalid_sdp(
                f"The SDP offer has more media sections than a call uses: at most one each of "
                f"{', '.join('m=' + k for k in _CALL_MEDIA_KINDS)} ({kinds.count(kind)} m={kind})."
            )
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
    limit = min(config.http.max_json_body_bytes, config.transport.max_http_body_bytes)
    if request.content_type == "multipart/form-data":
        return await _read_multipart(request, limit, config.webrtc.max_offer_parts, config.webrtc.max_sdp_bytes)
    if request.content_type in ("application/sdp", "text/plain", "application/octet-stream"):
        return CallOffer(check_sdp(_text(await read_body(request, config.webrtc.max_sdp_bytes), "sdp")), None)
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


async def _read_multipart(request: web.Request, limit: int, max_parts: int, max_sdp_bytes: int) -> CallOffer:
    reject_oversized(request, limit)
    parts: dict[str, bytes] = {}
    size = 0
    async with body_deadline(request, limit):
        try:
            reader = await request.multipart()
            for index in range(max_parts + 1):
                part = await reader.next()
                if part is None:
                    break
                if index == max_parts or isinstance(part, MultipartReader):
                    raise invalid_sdp(f"The multipart body may hold at most {max_parts} flat parts ('sdp', 'session').")
                data = await _read_part(part, limit - size, limit)
                size += len(data)
                name = part.name or ""
                parts.setdefault(name, data)
                if name == "sdp" and len(data) > max_sdp_bytes:
                    raise body_too_large(max_sdp_bytes)
        except (ValueError, RuntimeError, BadHttpMessage):
            # aiohttp's reader refuses a malformed boundary, an over-long or excess header this way.
            raise invalid_sdp("The multipart body is malformed.") from None
    if "sdp" not in parts:
        raise invalid_sdp("The multipart body has no 'sdp' part.")
    sdp = check_sdp(_text(parts["sdp"], "sdp"))
    session = None
    if "session" in parts:
        try:
            session = untrusted_json.loads(parts["session"])
        except ValueError:
            raise ApiError("The 'session' part is not valid JSON.", code=errors.INVALID_JSON, param="session") from None
        if not isinstance(session, dict):
            raise ApiError("'session' must be a JSON object.", code=errors.INVALID_VALUE, param="session")
    return CallOffer(sdp, session)


async def _read_part(part: BodyPartReader, budget: int, limit: int) -> bytes:
    """One part's bytes, refused (413) once the whole body would pass ``limit``. Parts are taken
    as sent: a compressed part could expand far past every bound, and no client encodes them."""
    for header in (hdrs.CONTENT_ENCODING, hdrs.CONTENT_TRANSFER_ENCODING):
        if part.headers.get(header, "identity").lower() not in ("identity", "binary", "7bit", "8bit"):
            raise invalid_sdp(f"Multipart parts must be sent unencoded (no {header}).")
    data = bytearray()
    while chunk := await part.read_chunk():
        data += chunk
        if len(data) > budget:
            raise body_too_large(limit)
    return bytes(data)
