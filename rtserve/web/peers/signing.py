"""Signed requests between front-ends over TCP (a cluster's front-ends on several hosts).

A peer site on a network port must serve only front-ends of the same cluster: a request
carries ``X-Rtserve-Peer: TIME.NONCE.MAC``, the HMAC-SHA256 under the cluster secret of the
wall-clock time, a fresh nonce and the method and path with query. The receiver refuses a
time outside ``max_clock_skew_s`` (front-end hosts keep NTP time) and a nonce it saw within
that window, so a captured request cannot be replayed. Unix sockets in the supervisor's
0700 folder need no signature: the file system already admits only this server's processes.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict

HEADER = "X-Rtserve-Peer"
_ROLE = b"rtserve-peer-request"


class PeerSigner:
    def __init__(self, secret: bytes, *, max_clock_skew_s: float, max_remembered: int) -> None:
        self._secret = secret
        self._skew_s = max_clock_skew_s
        self._max_remembered = max_remembered
        self._seen: OrderedDict[str, float] = OrderedDict()  # nonce -> when it may be forgotten

    def _mac(self, stamp: str, nonce: str, method: str, path_qs: str) -> str:
        message = b"\n".join((_ROLE, stamp.encode(), nonce.encode(), method.encode(), path_qs.encode()))
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def sign(self, method: str, path_qs: str) -> str:
        stamp, nonce = f"{time.time():.3f}", secrets.token_hex(16)
        return f"{stamp}.{nonce}.{self._mac(stamp, nonce, method, path_qs)}"

    def verify(self, header: str | None, method: str, path_qs: str) -> bool:
        """True once per signed request, within the clock window."""
        parts = (header or "").rsplit(".", 2)
        if len(parts) != 3:
            return False
        stamp, nonce, mac = parts
        if not hmac.compare_digest(mac, self._mac(stamp, nonce, method, path_qs)):
            return False
        now = time.time()
        try:
            if abs(now - float(stamp)) > self._skew_s:
                return False
        except ValueError:
            return False
        while self._seen and next(iter(self._seen.values())) < now:
            self._seen.popitem(last=False)
        if nonce in self._seen or len(self._seen) >= self._max_remembered:
            return False
        self._seen[nonce] = now + 2 * self._skew_s
        return True
