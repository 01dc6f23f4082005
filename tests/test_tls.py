"""``rtserve serve --ssl-certfile/--ssl-keyfile``: HTTPS and WSS with a self-signed pair like the
README's, in one process and with ``--workers 2``."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import signal
import ssl
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.test_cli import CLEAN_ENV, CLI, _free_port

START_TIMEOUT_S = 90


def self_signed_pair(folder: Path) -> tuple[Path, Path]:
    """What the README's openssl command makes: an EC P-256 key and a self-signed certificate
    for localhost / 127.0.0.1 (made with ``cryptography``, an aiortc dependency, so the test
    needs no openssl binary)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


async def _healthy(url: str, tls: ssl.SSLContext) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(f"{url}/health", ssl=tls) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, "server never became healthy over TLS"
            await asyncio.sleep(0.2)


@pytest.mark.parametrize("workers", [1, 2])
async def test_serves_https_and_wss_with_a_self_signed_pair(tmp_path: Path, workers: int) -> None:
    cert, key = self_signed_pair(tmp_path)
    port = _free_port()
    proc = subprocess.Popen(  # noqa: ASYNC220 - starts the server; the test waits on it over HTTPS
        [
            *CLI,
            "serve",
            "--engine",
            "loopback",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--ssl-certfile",
            str(cert),
            "--ssl-keyfile",
            str(key),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=CLEAN_ENV,
    )
    try:
        tls = ssl.create_default_context(cafile=str(cert))  # the client trusts exactly this certificate
        await _healthy(f"https://127.0.0.1:{port}", tls)
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(f"wss://127.0.0.1:{port}/v1/realtime", ssl=tls) as ws:
                created = json.loads((await asyncio.wait_for(ws.receive(), 15)).data)
                assert created["type"] == "session.created"
            with pytest.raises(aiohttp.ClientError):  # plain HTTP is not served on a TLS port
                async with http.get(f"http://127.0.0.1:{port}/health") as resp:
                    await resp.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_bad_key_file_is_a_one_line_config_error(tmp_path: Path) -> None:
    cert, _ = self_signed_pair(tmp_path)
    result = subprocess.run(
        [
            *CLI,
            "serve",
            "--engine",
            "loopback",
            "--port",
            str(_free_port()),
            "--ssl-certfile",
            str(cert),
            "--ssl-keyfile",
            str(tmp_path / "missing.pem"),
        ],
        capture_output=True,
        text=True,
        env=CLEAN_ENV,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "cannot load the TLS certificate" in result.stderr
