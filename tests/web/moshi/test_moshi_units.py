"""Building blocks of the Moshi routes: voice-name resolution and the output path's
behaviour under a stalled client."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.cascade.instructions import ANSWER_GUIDE
from rtserve.engines.lockstep.session import LockstepSession
from rtserve.engines.registry import create_engine
from rtserve.engines.values import SessionOptions, SlotPrompt, SlotSampling
from rtserve.sessions import SessionManager
from rtserve.web.moshi.bridge import AgentFrame, EngineBridge
from rtserve.web.moshi.metrics import MoshiMetrics
from rtserve.web.moshi.prompt import PromptQueryError, parse_seed, prompt_from_query, resolve_voice
from rtserve.web.moshi.service import MoshiService
from rtserve.web.moshi.turns import turn_session_config
from tests.web.moshi_support import WAIT_S, moshi_config, noise_signal

# ---------------------------------------------------------------------------- voices


@pytest.fixture
def voice_dir(tmp_path: Path) -> Path:
    voices = tmp_path / "voices"
    (voices / "custom").mkdir(parents=True)
    (voices / "NATF2.pt").write_bytes(b"v")
    (voices / "clone.wav").write_bytes(b"v")
    (voices / "custom" / "mine.pt").write_bytes(b"v")
    (tmp_path / "outside.pt").write_bytes(b"secret")
    (voices / "escape.pt").symlink_to(tmp_path / "outside.pt")
    (voices / "alias.pt").symlink_to(voices / "NATF2.pt")  # a link that stays inside is fine
    return voices


def test_known_voice_names_resolve_to_files_inside_the_directory(voice_dir: Path) -> None:
    assert resolve_voice("NATF2.pt", str(voice_dir)) == str(voice_dir / "NATF2.pt")
    assert resolve_voice("NATF2", str(voice_dir)) == str(voice_dir / "NATF2.pt")
    assert resolve_voice("clone", str(voice_dir)) == str(voice_dir / "clone.wav")
    assert resolve_voice("custom/mine.pt", str(voice_dir)) == str(voice_dir / "custom" / "mine.pt")
    assert resolve_voice("alias.pt", str(voice_dir)) == str(voice_dir / "NATF2.pt")
    assert resolve_voice(None, str(voice_dir)) is None
    assert resolve_voice("", None) is None


@pytest.mark.parametrize(
    "name",
    [
        "../outside.pt",
        "../outside",
        "custom/../../outside.pt",
        "/etc/passwd",
        "escape.pt",
        "escape",
        "..\\outside.pt",
        "NATF2.pt\x00.wav",
        "custom",
        "missing",
        "x" * 300,
    ],
)
def test_unsafe_or_unknown_voice_names_are_refused(voice_dir: Path, name: str) -> None:
    with pytest.raises(PromptQueryError) as info:
        resolve_voice(name, str(voice_dir))
    assert str(voice_dir.parent) not in str(info.value)  # no server path leaks to the client


def test_absolute_path_to_a_real_voice_is_still_refused(voice_dir: Path) -> None:
    with pytest.raises(PromptQueryError):
        resolve_voice(os.fspath(voice_dir / "NATF2.pt"), str(voice_dir))


def test_voices_need_a_configured_directory_except_personaplex_stock_names() -> None:
    with pytest.raises(PromptQueryError, match="not configured"):
        resolve_voice("my_clone", None)
    assert resolve_voice("NATF2", None) is None  # the engine's default voice (PersonaPlex's UI sends it)
    assert resolve_voice("VARM4.pt", None) is None


@given(st.text(max_size=40))
def test_resolution_never_escapes_the_directory(tmp_path_factory: pytest.TempPathFactory, name: str) -> None:
    root = tmp_path_factory.getbasetemp() / "hypothesis-voices"
    root.mkdir(exist_ok=True)
    try:
        path = resolve_voice(name, str(root))
    except PromptQueryError:
        return
    assert path is None or Path(path).is_relative_to(root.resolve())


def test_query_parameters_become_a_slot_prompt(voice_dir: Path) -> None:
    prompt = prompt_from_query({"text_prompt": "Be brief.", "voice_prompt": "NATF2", "seed": "7"}, str(voice_dir))
    assert (prompt.text, prompt.voice, prompt.seed) == ("Be brief.", str(voice_dir / "NATF2.pt"), 7)
    assert prompt_from_query({}, None) == prompt_from_query({"text_prompt": "", "seed": ""}, None)


@pytest.mark.parametrize("raw", ["abc", "1.5", "-2", str(2**63), True])
def test_bad_seeds_are_refused(raw: object) -> None:
    with pytest.raises(PromptQueryError):
        parse_seed(raw)  # type: ignore[arg-type]  # deliberately not always a str: refused at run time


def test_seed_minus_one_means_unseeded_as_in_personaplex() -> None:
    assert parse_seed("-1") is None
    assert prompt_from_query({"seed": "-1"}, None).seed is None


def test_personaplex_sampling_parameters_become_the_slots_sampling() -> None:
    query = {"text_temperature": "0.7", "text_topk": "25", "audio_temperature": "0.8", "audio_topk": "250"}
    assert prompt_from_query(query, None).sampling == SlotSampling(
        text_temperature=0.7, text_top_k=25, audio_temperature=0.8, audio_top_k=250
    )
    # Only what the client named is set; the rest stays the engine's default.
    assert prompt_from_query({"audio_temperature": "0"}, None).sampling == SlotSampling(audio_temperature=0.0)
    assert prompt_from_query({"text_prompt": "hi", "seed": "3"}, None).sampling is None


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("text_temperature", "hot"),
        ("audio_temperature", "-0.1"),
        ("audio_temperature", "nan"),
        ("text_temperature", "inf"),
        ("text_temperature", "1e400"),
        ("text_topk", "2.5"),
        ("audio_topk", "-1"),
        ("audio_topk", "many"),
        ("text_topk", "9" * 5000),
    ],
)
def test_bad_sampling_parameters_are_refused_naming_the_parameter(name: str, raw: str) -> None:
    with pytest.raises(PromptQueryError, match=name):
        prompt_from_query({name: raw}, None)


# ---------------------------------------------------------------------------- slow client


async def test_a_stalled_client_drops_its_own_oldest_frames_and_never_holds_the_engine(config: ServerConfig) -> None:
    config = moshi_config(config)
    config.lockstep.output_queue_frames = 2  # the one hand-off between the engine and the socket
    registry = CollectorRegistry()
    engine = create_engine("loopback", config, registry)
    metrics = MoshiMetrics(registry)
    service = MoshiService(config, engine, metrics)
    await engine.start()
    stalled = asyncio.Event()
    try:
        session = await engine.open_session("slow", SessionOptions())
        assert isinstance(session, LockstepSession)  # the loopback engine's
        conversation = EngineBridge(session, route="/test", metrics=metrics)

        async def send_frame(frame: AgentFrame) -> None:
            await stalled.wait()  # a client whose socket never drains

        output = asyncio.create_task(service.stream_output("/test", conversation, send_frame, None))
        lease = session.lease
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while lease.underruns < 12:  # ~1 s of ticks, all while the client is stalled
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
        # The engine kept ticking; the stalled reader lost its own oldest frames, nobody else's.
        assert lease.dropped_output_frames >= 8
        assert (registry.get_sample_value("rtserve_lockstep_dropped_output_frames_total") or 0) >= 8
        assert len(lease.output) == 2
        output.cancel()
        await asyncio.gather(output, return_exceptions=True)
        await conversation.close()
    finally:
        await engine.stop()


# ---------------------------------------------------------------------------- server path


async def test_each_agent_frame_says_when_the_input_its_tick_stepped_arrived(config: ServerConfig) -> None:
    """The server-path metric's stamp: a frame whose tick stepped a push carries that push's
    arrival; frames of ticks that found no new input carry none."""
    config = moshi_config(config)
    registry = CollectorRegistry()
    engine = create_engine("loopback", config, registry)
    metrics = MoshiMetrics(registry)
    await engine.start()
    try:
        session = await engine.open_session("stamped", SessionOptions())
        assert isinstance(session, LockstepSession)  # the loopback engine's
        bridge = EngineBridge(session, route="/test", metrics=metrics)
        frames = bridge.frames()
        loop = asyncio.get_running_loop()
        silent_ticks = 0
        for seed in range(3):
            pushed_from = loop.time()
            bridge.push(noise_signal(1, seed=seed))
            pushed_by = loop.time()
            while (frame := await asyncio.wait_for(anext(frames), WAIT_S)).input_at is None:
                silent_ticks += 1
            assert pushed_from <= frame.input_at <= pushed_by
        # Between pushes the engine kept ticking on silence: those frames carried no stamp.
        next_frame = await asyncio.wait_for(anext(frames), WAIT_S)
        assert next_frame.input_at is None and session.lease.underruns >= 1
        await bridge.close()
    finally:
        await engine.stop()


def test_a_persona_on_a_turn_engine_is_told_how_to_answer(config: ServerConfig) -> None:
    """The web UI's persona alone made the embedded LLM answer a question with word salad: on a
    turn engine the persona comes first, then the voice agent's rule for answering."""
    sessions = SessionManager(create_engine("loopback", config, CollectorRegistry()), config.sessions)
    persona = "You enjoy having a good conversation."
    told = turn_session_config(SlotPrompt(text=persona), sessions).instructions
    assert told == f"{persona} {ANSWER_GUIDE}"
    assert turn_session_config(SlotPrompt(text="  "), sessions).instructions == ""  # the engine's default
