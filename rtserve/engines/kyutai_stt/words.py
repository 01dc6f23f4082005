"""Text tokens -> timed words for one stream (docs/engines.md#kyutai-stt-engine).

Kyutai's text stream is mostly padding: ``text_padding_id`` between words and
``text_end_padding_id`` on the step where padding ends and a word begins. A word is the run
of tokens after such a boundary; it is complete when the next padding token comes (then
``Word`` goes out with the boundary's time as its start) and it ends at the next boundary
(``EndWord``). This is what moshi-server's streaming ASR state does, so its clients see the
same messages.

Times: the token made at generation step ``g`` (prefix steps included) is about the audio
that ended ``delay_s`` before the end of that step, so its time in the client's audio is
``(g + 1) / frame_rate - prefix - delay_s`` (clamped at 0), the prefix being the silence
frames fed before the client's first sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rtserve.engines.kyutai_stt.events import EndWord, Word
from rtserve.engines.kyutai_stt.settings import SttSettings


class WordTracker:
    """One stream's word assembly; ``feed`` each generated token in order, ``flush`` at the end."""

    def __init__(
        self,
        settings: SttSettings,
        decode: Callable[[Sequence[int]], str],
        padding_id: int,
        end_padding_id: int,
    ) -> None:
        self._decode = decode
        self._padding = padding_id
        self._end_padding = end_padding_id
        self._rate = settings.frame_rate
        self._offset = settings.prefix_frames / settings.frame_rate + settings.delay_s
        self._tokens: list[int] = []
        self._start = 0.0  # time of the latest word boundary
        self._last = 0.0  # time of the latest step fed
        self._unended = False  # a Word went out whose EndWord has not

    def time_of(self, generation_step: int) -> float:
        return max(0.0, (generation_step + 1) / self._rate - self._offset)

    def feed(self, generation_step: int, token: int) -> list[Word | EndWord]:
        events: list[Word | EndWord] = []
        now = self._last = self.time_of(generation_step)
        if token in (self._padding, self._end_padding):
            events += self._complete()
        else:
            self._tokens.append(token)
        if token == self._end_padding:
            if self._unended:
                events.append(EndWord(now))
                self._unended = False
            self._start = now
        return events

    def flush(self) -> list[Word | EndWord]:
        """The end of the stream: a word still open is complete and ends now."""
        events = self._complete()
        if self._unended:
            events.append(EndWord(max(self._start, self._last)))
            self._unended = False
        return events

    def _complete(self) -> list[Word | EndWord]:
        if not self._tokens:
            return []
        text = self._decode(self._tokens).strip()
        self._tokens = []
        if not text:
            return []
        self._unended = True
        return [Word(text, self._start)]
