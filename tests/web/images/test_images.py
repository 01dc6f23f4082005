"""``/v1/images/generations`` and ``/v1/images/edits`` over 127.0.0.1 with the official
``openai`` SDK, served by the step-batched image engine on a tiny random pipeline: images
decode to the size and format asked for, concurrent requests share denoising steps, every
bad input is a typed 4xx naming its field, a client that leaves frees its slot."""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import aiohttp
import numpy as np
import openai
import pytest
import pytest_asyncio
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from rtserve.app import build_app
from rtserve.config import ServerConfig, load_config
from tests.support import serve_app

FAST = {"num_inference_steps": 2, "guidance_scale": 3.0}
# A request that outlives a 1 s client timeout: the tiny pipeline takes ~5 ms a 64x64 step on an
# idle machine, so 200 steps (the default limit) could finish inside it. DDIM fails at 1000 steps
# (its timesteps reach index 1000 of 1000); 500 steps at 128x128 take seconds.
FOREVER_STEPS = 500


@dataclass
class Server:
    base: str
    client: openai.AsyncOpenAI

    async def counters(self) -> dict[str, float]:
        """The image engine's counters as ``/metrics`` shows them (``rtserve_image_`` dropped)."""
        async with aiohttp.ClientSession() as http, http.get(f"{self.base}/metrics") as response:
            text = await response.text()
        return {
            sample.name.removeprefix("rtserve_image_"): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name.startswith("rtserve_image_") and not sample.name.endswith("_created")
        }


def _config(config: ServerConfig, folder: Path | None, **engine: Any) -> ServerConfig:
    return config.model_copy(
        update={
            "engine": "loopback",
            "image_engine": config.image_engine.model_copy(
                update={"weights": None if folder is None else str(folder), "device": "cpu", **engine}
            ),
            "images": config.images.model_copy(
                update={
                    "default_size": "64x64",
                    "max_upload_bytes": 64 * 1024,
                    "max_upload_pixels": 128 * 128,
                    "max_steps": 1000,
                }
            ),
        }
    )


pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tiny_sd_folder: Path) -> AsyncIterator[Server]:
    """One server for the module: loading the pipeline per test would double its time."""
    async with _serve(_config(load_config(environ={}), tiny_sd_folder)) as server:
        yield server


@pytest_asyncio.fixture(loop_scope="module")
async def small_queue(config: ServerConfig, tiny_sd_folder: Path) -> AsyncIterator[Server]:
    async with _serve(_config(config, tiny_sd_folder, max_batch=1, max_queued=1)) as server:
        yield server


class _serve:
    def __init__(self, config: ServerConfig) -> None:
        self.app = build_app(config)
        self._serving = serve_app(self.app)

    async def __aenter__(self) -> Server:
        base = await self._serving.__aenter__()
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        async with aiohttp.ClientSession() as http:  # the engine loads in the background: 503 until it serves
            for _ in range(300):
                async with http.post(f"{base}/v1/images/generations", json={"prompt": ""}) as response:
                    if response.status != 503:
                        break
                await asyncio.sleep(0.05)
        return Server(base, client)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._serving.__aexit__(exc_type, exc, tb)


def _png(size: tuple[int, int] = (96, 64), fmt: str = "PNG") -> bytes:
    rng = np.random.default_rng(1)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buffer, format=fmt)
    return buffer.getvalue()


def _blank(size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size).save(buffer, format="PNG")
    return buffer.getvalue()


def _decoded(b64: str | None) -> Image.Image:
    assert b64 is not None
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    image.load()
    return image


async def test_generate_b64_images_of_the_size_asked(server: Server) -> None:
    result = await server.client.images.generate(
        prompt="a cup of coffee on the table",
        n=2,
        size="64x64",
        extra_body={"seed": 42, **FAST},
    )
    assert result.data is not None and len(result.data) == 2
    images = [_decoded(item.b64_json) for item in result.data]
    assert all(image.format == "PNG" and image.size == (64, 64) for image in images)
    assert images[0].tobytes() != images[1].tobytes()  # seeds 42 and 43
    again = await server.client.images.generate(
        prompt="a cup of coffee on the table",
        size="64x64",
        extra_body={"seed": 43, **FAST},
    )
    assert again.data is not None
    assert _decoded(again.data[0].b64_json).tobytes() == images[1].tobytes()  # the second image was seed + 1


@pytest.mark.parametrize(("output_format", "pil_format"), [("jpeg", "JPEG"), ("webp", "WEBP"), ("png", "PNG")])
async def test_output_formats(server: Server, output_format: Literal["jpeg", "webp", "png"], pil_format: str) -> None:
    result = await server.client.images.generate(
        prompt="a lighthouse",
        size="96x64",
        output_format=output_format,
        extra_body=FAST,
    )
    assert result.data is not None
    image = _decoded(result.data[0].b64_json)
    assert (image.format, image.size) == (pil_format, (96, 64))


async def test_url_and_file_responses(server: Server) -> None:
    result = await server.client.images.generate(prompt="a robot", response_format="url", extra_body=FAST)
    assert result.data is not None and result.data[0].url is not None
    async with aiohttp.ClientSession() as http:
        async with http.get(result.data[0].url) as response:
            assert response.status == 200 and response.content_type == "image/png"
            assert Image.open(io.BytesIO(await response.read())).size == (64, 64)
        async with http.get(f"{server.base}/v1/images/files/nosuchimage.png") as response:
            assert response.status == 404 and (await response.json())["error"]["code"] == "not_found"
        body = {"prompt": "a small robot reading", "response_format": "file", **FAST}
        async with http.post(f"{server.base}/v1/images/generations", json=body) as response:
            assert response.status == 200 and response.content_type == "image/png"
            assert 'filename="image.png"' in response.headers["Content-Disposition"]
            assert Image.open(io.BytesIO(await response.read())).size == (64, 64)


async def test_edits_with_the_sdk(server: Server) -> None:
    result = await server.client.images.edit(
        image=("input.png", _png(), "image/png"),
        prompt="Turn the background into a snowy mountain",
        extra_body={"num_inference_steps": 4, "strength": 0.5, "seed": 1},
    )
    assert result.data is not None
    assert _decoded(result.data[0].b64_json).size == (96, 64)  # size auto: the source's
    result = await server.client.images.edit(
        image=("input.jpg", _png(fmt="JPEG"), "image/jpeg"),
        prompt="snow",
        size="64x64",
        n=2,
        output_format="webp",
        extra_body={"num_inference_steps": 2, "strength": 1.0},
    )
    assert result.data is not None and len(result.data) == 2
    assert all(_decoded(item.b64_json).size == (64, 64) for item in result.data)


async def test_concurrent_requests_share_denoising_steps(server: Server) -> None:
    before = await server.counters()
    await asyncio.gather(
        *(
            server.client.images.generate(prompt=f"picture {i}", extra_body={"num_inference_steps": 6, "seed": i})
            for i in range(4)
        )
    )
    after = await server.counters()
    done = {name: after[name] - before[name] for name in after}
    assert done["requests_finished_total"] == 4
    assert done["request_steps_total"] == 24
    assert done["shared_denoiser_calls_total"] > 0
    assert done["denoiser_calls_total"] < 24  # fewer denoiser calls than request-steps


async def _error(call: Any) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        await call
    return caught.value


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"num_inference_steps": 0}, "num_inference_steps", "greater than or equal to 1"),
        ({"num_inference_steps": -1}, "num_inference_steps", "greater than or equal to 1"),
        ({"num_inference_steps": 6000}, "num_inference_steps", "less than or equal to"),
        ({"size": "1024x"}, "size", "WIDTHxHEIGHT"),
        ({"size": "63x64"}, "size", "multiples"),
        ({"size": "4096x4096"}, "size", "pixels"),
        ({"n": 0}, "n", "greater than or equal to 1"),
        ({"n": 11}, "n", "less than or equal to"),
        ({"guidance_scale": -1.0}, "guidance_scale", "greater than or equal to 0"),
        ({"output_format": "gif"}, "output_format", "png"),
        ({"response_format": "svg"}, "response_format", "b64_json"),
        ({"seed": -5}, "seed", "greater than or equal to 0"),
        ({"stream": True}, "stream", "not supported"),
        ({"prompt": ""}, "prompt", "at least 1"),
    ],
)
async def test_invalid_generation_inputs(server: Server, body: dict[str, Any], param: str, words: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{server.base}/v1/images/generations", json={"prompt": "x", **body}) as response:
            error = (await response.json())["error"]
            assert response.status == 400, error
    assert error["param"] == param and words in error["message"] and error["type"] == "invalid_request_error"


async def test_the_sdk_sees_a_typed_400(server: Server) -> None:
    error = await _error(server.client.images.generate(prompt="x", extra_body={"num_inference_steps": 0}))
    assert error.status_code == 400
    assert isinstance(error.body, dict) and error.body["param"] == "num_inference_steps"


@pytest.mark.parametrize(
    ("upload", "status", "code", "words"),
    [
        (("big.png", b"\x89PNG" + bytes(70 * 1024), "image/png"), 413, "request_too_large", "limit"),
        (("notes.png", b"not an image at all", "image/png"), 400, "invalid_image", "not a readable"),
        (("old.bmp", _png(fmt="BMP"), "image/bmp"), 400, "invalid_image", "Unsupported image format BMP"),
        (("wide.png", _blank((200, 100)), "image/png"), 400, "invalid_image", "200x100 pixels"),
    ],
)
async def test_invalid_uploads(
    server: Server, upload: tuple[str, bytes, str], status: int, code: str, words: str
) -> None:
    error = await _error(server.client.images.edit(image=upload, prompt="x", extra_body=FAST))
    assert error.status_code == status
    assert isinstance(error.body, dict) and (error.body["code"], error.body["param"]) == (code, "image")
    assert words in error.body["message"]


async def test_edit_form_refusals(server: Server) -> None:
    async with aiohttp.ClientSession() as http:
        form = aiohttp.FormData()
        form.add_field("prompt", "x")
        async with http.post(f"{server.base}/v1/images/edits", data=form) as response:
            assert response.status == 400
            assert (await response.json())["error"]["param"] == "image"
        form = aiohttp.FormData()
        form.add_field("image", _png(), filename="a.png", content_type="image/png")
        form.add_field("prompt", "x")
        form.add_field("num_inference_steps", "0")
        async with http.post(f"{server.base}/v1/images/edits", data=form) as response:
            error = (await response.json())["error"]
            assert response.status == 400 and error["param"] == "num_inference_steps"
        form = aiohttp.FormData()
        form.add_field("image", _png(), filename="a.png", content_type="image/png")
        form.add_field("mask", _png(), filename="m.png", content_type="image/png")
        form.add_field("prompt", "x")
        async with http.post(f"{server.base}/v1/images/edits", data=form) as response:
            assert response.status == 400 and (await response.json())["error"]["param"] == "mask"
        async with http.post(f"{server.base}/v1/images/edits", json={"prompt": "x"}) as response:
            assert response.status == 400 and (await response.json())["error"]["code"] == "invalid_content_type"


async def test_a_full_queue_answers_429(small_queue: Server) -> None:
    error = await _error(small_queue.client.images.generate(prompt="x", n=2, extra_body=FAST))
    assert error.status_code == 429
    assert isinstance(error.body, dict) and error.body["code"] == "resource_exhausted"


async def test_steps_the_scheduler_cannot_run_are_refused_without_failing_the_batch(server: Server) -> None:
    """1000 steps are within ``images.max_steps`` here, but the tiny pipeline's DDIM spaces them
    past its 1000-entry table: a typed 400, while a request beside it is served."""
    too_many = server.client.images.generate(prompt="x", extra_body={"num_inference_steps": 1000})
    error, beside = await asyncio.gather(_error(too_many), server.client.images.generate(prompt="y", extra_body=FAST))
    assert error.status_code == 400
    assert isinstance(error.body, dict) and (error.body["code"], error.body["param"]) == (
        "invalid_value",
        "num_inference_steps",
    )
    assert beside.data is not None


async def test_a_client_that_leaves_frees_its_slot(server: Server) -> None:
    before = await server.counters()
    impatient = server.client.with_options(timeout=1.0)
    with pytest.raises(openai.APITimeoutError):
        await impatient.images.generate(
            prompt="forever", size="128x128", extra_body={"num_inference_steps": FOREVER_STEPS}
        )
    for _ in range(200):
        counters = await server.counters()
        done = {name: counters[name] - before[name] for name in counters}
        if done["requests_cancelled_total"] == 1 and counters["requests_running"] == 0:
            break
        await asyncio.sleep(0.05)
    assert (done["requests_cancelled_total"], counters["requests_running"]) == (1, 0)
    assert done["requests_finished_total"] == 0 and done["request_steps_total"] < FOREVER_STEPS
    result = await server.client.images.generate(prompt="next", extra_body=FAST)  # the slot serves again
    assert result.data is not None


async def test_no_image_engine_answers_404(config: ServerConfig) -> None:
    async with _serve(_config(config, None)) as server:
        error = await _error(server.client.images.generate(prompt="x"))
    assert error.status_code == 404
    assert isinstance(error.body, dict) and error.body["code"] == "images_unavailable"
