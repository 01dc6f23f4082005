"""Server VAD turn detection on synthetic VAD scores (no model): offsets, padding, hysteresis."""

from __future__ import annotations

import numpy as np
import pytest

from rtserve.engines.cascade.turn_detection import ManualTurn, SealedTurn, TurnDetector
from rtserve.engines.events import SpeechStarted, SpeechStopped
from rtserve.engines.turn_detection import InvalidTurnDetection
from rtserve.engines.turn_detection import TurnDetection as ServerVadSettings

RATE = 16_000
WINDOW = 512  # 32 ms


def windows_for(scores: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """One window per score; each window's samples hold its index so audio can be traced."""
    windows = np.repeat(np.arange(len(scores), dtype=np.float32)[:, None], WINDOW, axis=1)
    return windows, np.array(scores, np.float32)


def detector(**settings: object) -> TurnDetector:
    return TurnDetector(
        ServerVadSettings.parse({"type": "server_vad", **settings}), RATE, WINDOW, max_turn_samples=RATE * 60
    )


def test_openai_defaults() -> None:
    settings = ServerVadSettings.parse({"type": "server_vad"})
    assert (settings.threshold, settings.prefix_padding_ms, settings.silence_duration_ms) == (0.5, 300, 500)


def test_start_and_stop_offsets_and_sealed_audio_with_prefix_padding() -> None:
    # 20 silent windows (640 ms), 30 voiced (960 ms), then silence.
    scores = [0.02] * 20 + [0.9] * 30 + [0.02] * 40
    happened = detector().feed(*windows_for(scores), first_sample=0)
    started, stopped, sealed = happened
    assert started == SpeechStarted(audio_ms=20 * WINDOW * 1000 // RATE)  # 640
    assert stopped == SpeechStopped(audio_ms=50 * WINDOW * 1000 // RATE)  # 1600: end of the last voiced window
    assert isinstance(sealed, SealedTurn)
    # 300 ms of lead-in = 10 windows (ceil), so the turn starts at window 10.
    first_window = int(sealed.audio[0])
    assert first_window == 10
    # The stop waited 500 ms of silence = 16 windows, which the sealed audio keeps.
    assert int(sealed.audio[-1]) == 50 + 16 - 1
    assert len(sealed.audio) == (50 + 16 - 10) * WINDOW


def test_offsets_continue_across_calls() -> None:
    turn = detector()
    assert turn.feed(*windows_for([0.0] * 5), first_sample=0) == []
    happened = turn.feed(*windows_for([0.8]), first_sample=5 * WINDOW)
    assert happened == [SpeechStarted(audio_ms=5 * WINDOW * 1000 // RATE)]
    assert turn.speaking


def test_hysteresis_keeps_wavering_speech_in_one_turn() -> None:
    # Scores between threshold-0.15 and threshold do not count as silence.
    scores = [0.9] * 5 + [0.4] * 40 + [0.9] * 5
    happened = detector().feed(*windows_for(scores), first_sample=0)
    assert [type(h) for h in happened] == [SpeechStarted]


def test_short_pause_does_not_end_the_turn_but_a_long_one_does() -> None:
    turn = detector(silence_duration_ms=200)  # 7 windows
    happened = turn.feed(*windows_for([0.9] * 3 + [0.0] * 6 + [0.9] * 3), first_sample=0)
    assert [type(h) for h in happened] == [SpeechStarted]
    happened = turn.feed(*windows_for([0.0] * 7), first_sample=12 * WINDOW)
    assert [type(h) for h in happened] == [SpeechStopped, SealedTurn]
    assert not turn.speaking


def test_threshold_is_configurable() -> None:
    scores = [0.6] * 10
    assert detector(threshold=0.7).feed(*windows_for(scores), first_sample=0) == []
    assert [type(h) for h in detector(threshold=0.5).feed(*windows_for(scores), first_sample=0)] == [SpeechStarted]


def test_turn_ids_change_after_each_turn() -> None:
    turn = detector(silence_duration_ms=64)
    first = turn.turn_id
    happened = turn.feed(*windows_for([0.9, 0.9, 0.0, 0.0, 0.0]), first_sample=0)
    sealed = happened[-1]
    assert isinstance(sealed, SealedTurn) and sealed.turn_id == first
    assert turn.turn_id != first


def test_turn_audio_is_capped_oldest_first() -> None:
    turn = TurnDetector(ServerVadSettings(), RATE, WINDOW, max_turn_samples=4 * WINDOW)
    turn.feed(*windows_for([0.9] * 10), first_sample=0)
    audio = turn.turn_audio()
    assert len(audio) == 4 * WINDOW and int(audio[0]) == 6
    assert turn.dropped_samples == 6 * WINDOW


@pytest.mark.parametrize(
    "value, code",
    [
        ({"type": "turn_model"}, "unsupported_turn_detection"),
        ({"type": "server_vad", "threshold": 1.5}, "invalid_turn_detection"),
        ({"type": "server_vad", "silence_duration_ms": -1}, "invalid_turn_detection"),
        ({"type": "server_vad", "prefix_padding_ms": "long"}, "invalid_turn_detection"),
    ],
)
def test_invalid_settings_are_typed_errors(value: dict, code: str) -> None:
    with pytest.raises(InvalidTurnDetection) as raised:
        ServerVadSettings.parse(value)
    assert raised.value.code == code
    assert "turn_detection" in str(raised.value)


def test_manual_turn_collects_everything_until_taken() -> None:
    turn = ManualTurn(max_turn_samples=RATE)
    assert not turn.speaking
    turn.append(np.ones(100, np.float32))
    turn.append(np.full(50, 2.0, np.float32))
    assert turn.speaking and turn.turn_samples == 150
    sealed = turn.take_turn()
    assert len(sealed.audio) == 150 and sealed.audio[-1] == 2.0
    assert not turn.speaking and turn.turn_id == sealed.turn_id + 1


def test_a_pause_is_visible_before_the_stop() -> None:
    turn = detector()
    turn.feed(*windows_for([0.9] * 3), first_sample=0)
    assert turn.speaking and not turn.pausing
    turn.feed(*windows_for([0.0] * 2), first_sample=3 * WINDOW)
    assert turn.pausing
    turn.feed(*windows_for([0.9]), first_sample=5 * WINDOW)
    assert not turn.pausing


def test_a_pause_can_end_the_turn_early_until_speech_resumes() -> None:
    turn = detector()  # 500 ms (16 windows) of silence end a turn
    assert [type(h) for h in turn.feed(*windows_for([0.9] * 10 + [0.02] * 5), first_sample=0)] == [SpeechStarted]
    assert turn.pausing and turn.pause_ms == 5 * WINDOW * 1000 // RATE
    turn.end_pause_after(200)  # 7 windows: two more silent windows end it
    stopped, sealed = turn.feed(*windows_for([0.02] * 2), first_sample=15 * WINDOW)
    assert stopped == SpeechStopped(audio_ms=10 * WINDOW * 1000 // RATE)
    assert isinstance(sealed, SealedTurn) and len(sealed.audio) == 17 * WINDOW

    # Speech resuming in the pause cancels the early end: the next pause waits the full 500 ms.
    turn.feed(*windows_for([0.9] * 10 + [0.02] * 3), first_sample=0)
    turn.end_pause_after(200)
    assert turn.feed(*windows_for([0.9] * 3 + [0.02] * 10), first_sample=13 * WINDOW) == []
    assert [type(h) for h in turn.feed(*windows_for([0.02] * 6), first_sample=26 * WINDOW)] == [
        SpeechStopped,
        SealedTurn,
    ]


def test_end_pause_after_outside_a_pause_does_nothing() -> None:
    turn = detector()
    turn.end_pause_after(100)  # no turn
    turn.feed(*windows_for([0.9] * 5), first_sample=0)
    turn.end_pause_after(100)  # speaking, not pausing
    assert turn.feed(*windows_for([0.02] * 10), first_sample=5 * WINDOW) == []


def test_pause_key_names_one_pause() -> None:
    turn = detector()
    turn.feed(*windows_for([0.9] * 5 + [0.02] * 3), first_sample=0)
    key = turn.pause_key
    turn.feed(*windows_for([0.02] * 2), first_sample=8 * WINDOW)
    assert turn.pause_key == key  # the same pause, longer
    turn.feed(*windows_for([0.9, 0.02]), first_sample=10 * WINDOW)
    assert turn.pause_key != key  # speech resumed: another pause
    last = turn.pause_key
    *_, sealed = turn.feed(*windows_for([0.02] * 16), first_sample=12 * WINDOW)
    assert isinstance(sealed, SealedTurn) and sealed.pause_key == last
    assert turn.pause_key != last  # the next turn
