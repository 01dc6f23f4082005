"""``POST /v1/realtime/client_secrets``: a browser places its call with a short-lived ``ek_``
key minted by the application's backend, never with the server's API key (OpenAI's browser
flow), driven by the official ``openai`` SDK."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai
import pytest

from rtserve.app import build_app
from rtserve.config import ServerConfig
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

        for seconds in (5, 7201, "60"):
            with pytest.raises(openai.BadRequestError) as bad_ttl:
                await backend.realtime.client_secrets.create(expires_after={"anchor": "created_at", "seconds": seconds})  # type: ignore
            assert bad_ttl.value.param == "expires_after.seconds"
        with pytest.raises(openai.BadRequestError) as bad_session:
            await backend.realtime.client_secrets.create(session={"type": "realtime", "instructions": 7})  # type: ignore
        assert bad_session.value.param == "session.instructions"
