"""``POST /v1/realtime/client_secrets``: a browser places its call with a short-lived ``ek_``
key minted by the application's backend, never with the server's API key (OpenAI's browser
flow), driven by the official ``openai`` SDK."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time

import aiohttp
import openai
import pytest

from rtserve.app import build_app
from rtserve.config import ConfigError, ServerConfig, load_config
from rtserve.web.webrtc.client_secrets import ClientSecrets
from rtserve.web.webrtc.routes import SECRETS
from tests.support import serve_app
from tests.web.realtime_support import HANG_GUARD_S, loopback_config
from tests.web.webrtc.test_webrtc_calls import sdk
from tests.web.webrtc_support import Caller, webrtc_config

SERVER_KEY = "sk-server-only"


async def test_client_secret_places_calls_only_until_it_expires(config: ServerConfig) -> None:
    config = webrtc_config(loopback_config(config))
    config.api_key = SERVER_KEY
    app = build_app(config)
    async with serve_app(app) as base, aiohttp.ClientSession() as http:
        async with asyncio.timeout(HANG_GUARD_S):
            while (await http.get(f"{base}/health")).status != 200:
                await asyncio.sleep(0.05)
        backend = sdk(base, SERVER_KEY)
        secret = await backend.realtime.client_secrets.create(
            expires_after={"anchor": "created_at", "seconds": 60},
            session={"type": "realtime", "instructions": "bound to the key"},
        )
        assert secret.value.startswith("ek_") and SERVER_KEY not in secret.value
        assert abs(secret.expires_at - (time.time() + 60)) < 5
        assert secret.session.type == "realtime" and secret.session.instructions == "bound to the key"

        browser = sdk(base, secret.value)
        caller = Caller()
        await caller.call(browser)
        created = await caller.until("session.created")
        assert created["session"]["instructions"] == "bound to the key"  # the key's session
        await caller.close()

        # The key places calls and nothing else.
        with pytest.raises(openai.AuthenticationError):
            await browser.models.list()
        with pytest.raises(openai.AuthenticationError):
            await browser.realtime.client_secrets.create()
        async with http.ws_connect(
            f"{base.replace('http', 'ws')}/v1/realtime", headers={"Authorization": f"Bearer {secret.value}"}
        ) as ws:
            assert (await ws.receive()).data == 4001

        # Unknown, tampered and expired keys are refused.
        body, signature = secret.value.split(".")
        for bad in ("ek_unknown.key", f"{body[:-2]}AA.{signature}", "ek_a.b.c"):
            with pytest.raises(openai.AuthenticationError):
                await sdk(base, bad).realtime.calls.create(sdp=await Caller().offer())
        app[SECRETS].clock = lambda: time.time() + 61
        with pytest.raises(openai.AuthenticationError) as expired:
            await browser.realtime.calls.create(sdp=await Caller().offer())
        assert expired.value.code == "invalid_api_key"
        app[SECRETS].clock = time.time

        for seconds in (5, 7201, "60"):  # out of range, and deliberately not an int: refused by the server
            with pytest.raises(openai.BadRequestError) as bad_ttl:
                await backend.realtime.client_secrets.create(expires_after={"anchor": "created_at", "seconds": seconds})  # type: ignore[arg-type]
            assert bad_ttl.value.param == "expires_after.seconds"
        with pytest.raises(openai.BadRequestError) as bad_session:  # instructions deliberately not a str
            await backend.realtime.client_secrets.create(session={"type": "realtime", "instructions": 7})  # type: ignore[arg-type]
        assert bad_session.value.param == "session.instructions"


def _signature_under_api_key(value: str, api_key: str) -> str:
    """The signature as the server made it before: keyed from the API key alone."""
    body64 = value[len("ek_") :].split(".")[0]
    key = hashlib.sha256(b"rtserve client secret\0" + api_key.encode()).digest()
    return base64.urlsafe_b64encode(hmac.new(key, body64.encode(), hashlib.sha256).digest()).rstrip(b"=").decode()


def test_a_secret_tells_its_holder_nothing_about_the_api_key() -> None:
    # Before: from one minted key, 5003 offline guesses found a password-like API key in 9 ms.
    config = load_config(overrides={"api_key": SERVER_KEY}, environ={})
    value = ClientSecrets(config).mint({}).value
    assert value.split(".")[1] != _signature_under_api_key(value, SERVER_KEY)
    # The same API key on another server start signs with another key.
    assert ClientSecrets(load_config(overrides={"api_key": SERVER_KEY}, environ={})).verify(value) is None


def test_workers_and_cluster_front_ends_share_the_key_and_keys_rotate() -> None:
    server = load_config(environ={})
    worker = ServerConfig.model_validate(server.model_dump(mode="json"))  # as the supervisor starts workers
    assert ClientSecrets(worker).verify(ClientSecrets(server).mint({}).value) is not None

    front_ends = [load_config(environ={"RTSERVE_CLUSTER__SECRET": "a-cluster-secret-of-some-length"}) for _ in range(2)]
    assert ClientSecrets(front_ends[1]).verify(ClientSecrets(front_ends[0]).mint({}).value) is not None

    old, new = "o" * 32, "n" * 32
    before = ClientSecrets(load_config(overrides={"webrtc": {"client_secret_keys": [old]}}, environ={}))
    rotating = ClientSecrets(load_config(overrides={"webrtc": {"client_secret_keys": [new, old]}}, environ={}))
    after = ClientSecrets(load_config(overrides={"webrtc": {"client_secret_keys": [new]}}, environ={}))
    handed_out = before.mint({}).value
    assert rotating.verify(handed_out) is not None  # secrets already handed out still place calls
    assert after.verify(handed_out) is None  # until the old key is dropped
    assert after.verify(rotating.mint({}).value) is not None  # the first key signs
    with pytest.raises(ConfigError, match="client_secret_keys"):
        load_config(overrides={"webrtc": {"client_secret_keys": ["short"]}}, environ={})
