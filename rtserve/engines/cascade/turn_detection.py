"""Server-side turn detection with OpenAI ``server_vad`` semantics, on VAD window scores.

``TurnDetector`` is pure bookkeeping (no model, no I/O): it is fed consecutive VAD windows
with their speech probability and says when speech started and stopped, keeping the audio
of the current turn (with ``prefix_padding_ms`` of lead-in) for the recognizer.

* start: the first window scoring ``>= threshold``; ``SpeechStarted.audio_ms`` is that
  window's start in the session's input timeline.
* stop: ``silence_duration_ms`` (``semantic_vad``: by eagerness) of windows scoring below
  ``threshold - 0.15`` (Silero's own hysteresis, so a wavering score does not chop a word);
  ``SpeechStopped.audio_ms`` is the end of the last voiced window. The turn's audio (including the trailing silence the
  decision waited for, which helps the recognizer end cleanly) is then sealed.
* early stop: ``end_pause_after(ms)`` lets the current pause end the turn sooner (the
  session calls it when the transcript of the pause reads as a finished sentence); speech
  resuming cancels it. ``pause_key`` names one pause: it changes whenever speech resumes or
  the turn changes, so work started for a pause can tell whether it still stands.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.cascade.audio import AudioBuffer
from rtserve.engines.events import SpeechStarted, SpeechStopped
from rtserve.engines.turn_detection import TurnDetection

_HYSTERESIS = 0.15


@dataclass
class SealedTurn:
    """The audio of one finished utterance, ready for the final transcript."""

    turn_id: int
    audio: FloatArray
    pause_key: tuple[int, int]  # the detector's ``pause_key`` while the turn's final silence ran
    # Where the VAD heard its speech end (a sample offset in the session's input, the VAD's rate);
    # None: ended by a manual commit.
    voiced_end: int | None = None


class _TurnAudio:
    """The audio of the turn in progress and its id, shared by both turn policies."""

    def __init__(self, max_turn_samples: int) -> None:
        self._turn = AudioBuffer(max_turn_samples)
        self._turn_id = 0

    @property
    def turn_id(self) -> int:
        """Id of the current (or next) turn; changes whenever a turn is sealed or reset."""
        return self._turn_id

    @property
    def dropped_samples(self) -> int:
        """Turn audio dropped over ``max_turn_samples``, oldest first."""
        return self._turn.dropped_samples

    @property
    def turn_samples(self) -> int:
        return len(self._turn)

    def turn_audio(self) -> FloatArray:
        return self._turn.audio()

    @property
    def pause_key(self) -> tuple[int, int]:
        """(turn id, samples the turn had taken up to its last voiced window): one value per
        pause, changing whenever speech resumes or the turn changes."""
        return self._turn_id, len(self._turn) + self._turn.dropped_samples - self._trailing_silence()

    def _trailing_silence(self) -> int:
        return 0

    def take_turn(self) -> SealedTurn:
        """End the current turn now (a manual commit) and hand over its audio."""
        sealed = SealedTurn(self._turn_id, self.turn_audio(), self.pause_key)
        self.reset()
        return sealed

    def reset(self) -> None:
        """Forget the current turn (commit, clear, or after a stop); a new turn id follows."""
        self._turn.clear()
        self._turn_id += 1


class TurnDetector(_TurnAudio):
    def __init__(self, settings: TurnDetection, sample_rate: int, window: int, max_turn_samples: int) -> None:
        super().__init__(max_turn_samples)
        self.settings = settings
        self._rate = sample_rate
        self._window = window
        self._prefix: deque[FloatArray] = deque(maxlen=self._windows(settings.prefix_padding_ms))
        self._speaking = False
        self._silent_windows = 0
        self._early_stop_windows: int | None = None

    def _windows(self, ms: int) -> int:
        return -(-ms * self._rate // (1000 * self._window))  # ceil

    @property
    def speaking(self) -> bool:
        return self._speaking

    @property
    def pausing(self) -> bool:
        """In a turn, but the latest window was silence (the stop may be coming)."""
        return self._speaking and self._silent_windows > 0

    @property
    def pause_ms(self) -> int:
        """Silence since the last voiced window of the turn (0 while voiced or between turns)."""
        return self._silent_windows * self._window * 1000 // self._rate if self._speaking else 0

    def _trailing_silence(self) -> int:
        return self._silent_windows * self._window

    def end_pause_after(self, silence_ms: int) -> None:
        """Let the current pause end the turn after ``silence_ms`` of silence if that is sooner
        than the settings' wait; speech resuming cancels it."""
        if self.pausing:
            self._early_stop_windows = max(self._windows(silence_ms), 1)

    def feed(
        self,
        windows: FloatArray,
        scores: FloatArray,
        first_sample: int,
    ) -> list[SpeechStarted | SpeechStopped | SealedTurn]:
        """Consume ``[n, window]`` audio with its ``n`` scores; ``first_sample`` is the offset of
        ``windows[0]`` in the session's input. Returns what happened, in order."""
        out: list[SpeechStarted | SpeechStopped | SealedTurn] = []
        stop_after = self._windows(self.settings.stop_silence_ms)
        for i, (window, score) in enumerate(zip(windows, scores, strict=True)):
            start = first_sample + i * self._window
            if not self._speaking:
                if score >= self.settings.threshold:
                    self._speaking = True
                    self._silent_windows = 0
                    for lead_in in self._prefix:
                        self._turn.append(lead_in)
                    self._prefix.clear()
                    self._turn.append(window)
                    out.append(SpeechStarted(self._ms(start)))
                else:
                    self._prefix.append(window)
                continue
            self._turn.append(window)
            if score < self.settings.threshold - _HYSTERESIS:
                self._silent_windows += 1
            else:
                self._silent_windows = 0
                self._early_stop_windows = None
            if self._silent_windows >= max(min(stop_after, self._early_stop_windows or stop_after), 1):
                voiced_end = start + self._window - self._silent_windows * self._window
                out.append(SpeechStopped(self._ms(voiced_end)))
                out.append(SealedTurn(self._turn_id, self.turn_audio(), self.pause_key, voiced_end))
                self.reset()
        return out

    def reset(self) -> None:
        super().reset()
        self._prefix.clear()
        self._speaking = False
        self._silent_windows = 0
        self._early_stop_windows = None

    def _ms(self, sample: int) -> int:
        return sample * 1000 // self._rate


class ManualTurn(_TurnAudio):
    """Turn detection off (``turn_detection: null``): all audio since the last commit or
    clear is the turn; the client decides where it ends."""

    @property
    def speaking(self) -> bool:
        return len(self._turn) > 0

    @property
    def pausing(self) -> bool:
        return False  # no VAD: nothing is known about pauses

    def append(self, pcm: FloatArray) -> None:
        self._turn.append(pcm)
