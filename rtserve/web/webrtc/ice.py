"""ICE settings of the server's peer connections: STUN/TURN servers and host candidates.

aiortc falls back to Google's public STUN server when given no ICE servers; the server
passes its configured list (possibly empty) instead, so nothing is contacted unasked.

Host candidates: aioice gathers one per interface address and always leaves 127.0.0.1 out.
``webrtc.host_addresses`` names the exact addresses to offer instead (``[127.0.0.1]`` for
tests and local use, a public address behind 1:1 NAT). aioice has no per-connection hook
for this, so the choice replaces its module-level address lookup: it is process-wide.
"""

from __future__ import annotations

from collections.abc import Sequence

import aioice.ice
from aiortc import RTCConfiguration, RTCIceServer

from rtserve.config import WebRtcConfig

_AIOICE_HOST_ADDRESSES = aioice.ice.get_host_addresses


def use_host_addresses(addresses: Sequence[str] | None) -> None:
    """Offer exactly ``addresses`` as host candidates in this process (None: aioice's own choice)."""
    if addresses is None:
        aioice.ice.get_host_addresses = _AIOICE_HOST_ADDRESSES
        return
    chosen = list(addresses)

    def configured(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [a for a in chosen if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = configured


def rtc_configuration(config: WebRtcConfig) -> RTCConfiguration:
    return RTCConfiguration(
        iceServers=[RTCIceServer(urls=s.urls, username=s.username, credential=s.credential) for s in config.ice_servers]
    )
