"""The voice sandbox child with hostile models (``tests/hostile_voices.py``): each limit ends
the child, never this process, and is reported as its own typed error; the next call gets a
fresh child. The server-level checks (RSS, other clients, the HTTP errors) are in
``tests/web/http/test_voices_hostile.py``."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from rtserve.engines.cascade.voice_sandbox import SandboxLimits, SpeechTooLong, VoiceModelRejected, VoiceSandbox
from rtserve.engines.errors import EngineError
from tests.hostile_voices import constant_of_shape, joe_files, looping, quadratic

pytestmark = pytest.mark.models

SECOND = 22050  # samples of one second at the Joe config's rate
LONG = "This sentence goes on for quite a while so that its phoneme ids are many, many more than a greeting has."


def stored(tmp_path: Path, name: str, model: bytes) -> Path:
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(model)
    Path(f"{path}.json").write_text(json.dumps(joe_files()[1]))
    return path


LIMITS = SandboxLimits(memory_bytes=1 << 30, cpu_s=30.0, wall_s=30.0, cpu_threads=1, max_loaded=2)


def sandbox(limits: SandboxLimits = LIMITS) -> VoiceSandbox:
    return VoiceSandbox(limits)


def speak(box: VoiceSandbox, path: Path, text: str = "Hello.", max_samples: int = 30 * SECOND):
    return box.speak(path, str(path), text, 1.0, max_samples, param="model")


def test_a_real_voice_speaks_and_the_child_survives_for_the_next_request(tmp_path):
    joe = stored(tmp_path, "joe", joe_files()[0])
    box = sandbox()
    try:
        audio, rate = speak(box, joe)
        assert rate == SECOND and 0.3 * SECOND < audio.size < 3 * SECOND and abs(audio).max() > 0.01
        assert speak(box, joe, "Bye.")[0].size > 0
    finally:
        box.close()


def test_deleted_voices_are_dropped_and_room_is_made_before_a_load(tmp_path):
    # Before: the child kept deleted voices and loaded a new one before evicting, so a soak of
    # upload/speak/delete rounds grew ~150 MB a round until the 4th voice broke the memory cap.
    voices = [stored(tmp_path, f"v{i}", joe_files()[0]) for i in range(3)]
    box = sandbox()  # max_loaded=2
    try:
        speak(box, voices[0])
        speak(box, voices[1])
        assert box.loaded_voices == 2
        speak(box, voices[2])
        assert box.loaded_voices == 2  # the oldest went first
        box.forget(str(voices[1]))
        speak(box, voices[2])
        assert box.loaded_voices == 1
    finally:
        box.close()


def test_each_limit_ends_the_child_with_its_own_error_and_the_next_call_starts_a_new_one(tmp_path):
    joe = stored(tmp_path, "joe", joe_files()[0])
    cases = [
        (stored(tmp_path, "bomb", constant_of_shape(268435456)), LIMITS, "sandbox_memory_bytes"),
        # The wall limit also bounds the fresh child's first sentence (a Piper load): 20 s holds
        # it on a loaded 2-core machine, where 12 s did not.
        (stored(tmp_path, "spin", looping(10**12)), replace(LIMITS, wall_s=20.0), "sandbox_wall_s"),
        (stored(tmp_path, "burn", looping(10**12)), replace(LIMITS, cpu_s=1.0), "sandbox_cpu_s"),
    ]
    for path, limits, named in cases:
        box = sandbox(limits)
        try:
            started = time.perf_counter()
            with pytest.raises(VoiceModelRejected) as rejected:
                speak(box, path)
            assert named in rejected.value.message and rejected.value.code == "voice_model_rejected"
            assert time.perf_counter() - started < 40, named  # the wall-clock case waits 20 s by design
            assert speak(box, joe)[0].size > 0  # a fresh child
        finally:
            box.close()


def test_audio_past_its_bound_stops_the_sentence_and_garbage_does_not_load(tmp_path):
    box = sandbox()
    try:
        grows = stored(tmp_path, "grows", quadratic(100))
        assert speak(box, grows)[0].size < 3 * SECOND  # a greeting is short
        with pytest.raises(SpeechTooLong) as too_long:
            speak(box, grows, LONG, max_samples=60 * SECOND)
        assert too_long.value.code == "speech_too_long"
        with pytest.raises(EngineError) as garbage:
            speak(box, stored(tmp_path, "garbage", b"not an onnx model" * 10))
        assert garbage.value.code == "invalid_voice_model" and garbage.value.param == "model"
    finally:
        box.close()
