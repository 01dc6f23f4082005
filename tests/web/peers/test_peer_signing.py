"""Signed requests between front-ends: a request verifies once, within the clock window, under
the cluster secret and for the method and path it was signed for; the nonce memory is bounded."""

from __future__ import annotations

import time

import pytest

from rtserve.web.peers.signing import PeerSigner

SECRET = b"0123456789abcdef-cluster-secret"


def _signer(secret: bytes = SECRET, remembered: int = 16) -> PeerSigner:
    return PeerSigner(secret, max_clock_skew_s=30, max_remembered=remembered)


def test_a_signed_request_verifies_once() -> None:
    sender, receiver = _signer(), _signer()
    header = sender.sign("GET", "/v1/realtime?duplex=1")
    assert receiver.verify(header, "GET", "/v1/realtime?duplex=1")
    assert not receiver.verify(header, "GET", "/v1/realtime?duplex=1")  # a replay


@pytest.mark.parametrize("change", ["secret", "method", "path", "mac", "garbage", "missing"])
def test_anything_but_the_signed_request_under_the_secret_is_refused(change: str) -> None:
    sender = _signer(b"another-secret-0123456789" if change == "secret" else SECRET)
    header: str | None = sender.sign("GET", "/v1/realtime")
    method, path = "GET", "/v1/realtime"
    if change == "method":
        method = "POST"
    elif change == "path":
        path = "/v1/realtime?session_id=x"
    elif change == "mac":
        assert header is not None
        header = header[:-1] + ("0" if header[-1] != "0" else "1")
    elif change == "garbage":
        header = "not.a-signature"
    elif change == "missing":
        header = None
    assert not _signer().verify(header, method, path)


def test_a_request_outside_the_clock_window_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    now = 1_000_000.0
    monkeypatch.setattr(time, "time", lambda: now)
    header = _signer().sign("GET", "/x")
    now += 31
    assert not _signer().verify(header, "GET", "/x")


def test_when_the_nonce_memory_is_full_new_requests_wait_for_old_ones_to_age_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = 1_000_000.0
    monkeypatch.setattr(time, "time", lambda: now)
    sender, receiver = _signer(), _signer(remembered=16)
    assert all(receiver.verify(sender.sign("GET", "/x"), "GET", "/x") for _ in range(16))
    assert not receiver.verify(sender.sign("GET", "/x"), "GET", "/x")  # never forgets one still replayable
    now += 61  # past twice the window: the old nonces can no longer be replayed, so they go
    assert receiver.verify(sender.sign("GET", "/x"), "GET", "/x")
