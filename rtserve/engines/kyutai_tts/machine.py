"""The TTS text-stream state machine for B rows at once, as tensors (docs/engines.md#kyutai-tts).

Delayed-streams TTS does not get its text pre-aligned: at each step the model predicts
either "pad" or "a new word starts" on the text stream, and this machine answers with the
token actually fed back. When the model asks for a word (or must, after ``max_padding``
pads in a row) the next pending word is popped and its tokens are fed over the following
steps, one per step; a word's ``padding`` forces that many pads after it; with a lookahead
stream (``second_stream_ahead``) the tokens of the word that many words ahead are fed on a
second text stream, muxed into the same token as ``(second + 1) * card + first``.

This is the reference's ``StateMachine.process`` (``moshi.models.tts``) with its per-row
Python state (deques, counters) laid out as ``[B, ...]`` tensors, so every row advances in
one fixed sequence of tensor operations with no host round trip:

* pending words: a ring of ``max_words`` entries of up to ``max_word_tokens`` tokens;
* the current word's remaining tokens and the lookahead stream's queue;
* the padding counters, the step at which the text ran out (``end_step``, -1 before) and
  the end-of-stream flag (the client said no more words will come).

A row only steps when it is safe to (``ready``): a streaming client may not have sent the
next words yet, and popping from an empty queue would end the utterance; such a row waits at
the steps that may pop a word, as Kyutai's server does, and takes the others (the current
word's later tokens, forced pads) whatever has arrived, since they read no pending word.
A step that may pop mostly does not (the model pads a few frames after each word), and only the
token the model samples says which (``asks_word``): the model may try such a step for a row that
lacks the words and keep it where the model padded, as the reference would have with all the text
(docs/engines.md#tried-steps). Rows that do not step keep their state exactly (``step`` masks).
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch


@dataclass(frozen=True)
class TokenIds:
    """The text stream's special tokens (the reference's ``TokenIds``); ``card`` is
    ``text_card + 1``, the base of the muxed lookahead token."""

    card: int
    new_word: int = 0
    pad: int = 3
    main: int = 1  # the main speaker's turn, before a session's first word


@dataclass(frozen=True)
class MachineSettings:
    ids: TokenIds
    second_stream_ahead: int = 0
    max_padding: int = 8
    initial_padding: int = 2
    max_words: int = 64  # pending words per row (the text backlog bound)
    max_word_tokens: int = 64

    @property
    def lookahead_capacity(self) -> int:
        return 4 * self.max_word_tokens


@dataclass(frozen=True)
class MachineStep:
    tokens: torch.Tensor  # [B] the text token to feed (muxed with the lookahead stream)
    consumed: torch.Tensor  # [B] bool: a word was popped this step
    overflow: torch.Tensor  # [B] bool: the lookahead queue overflowed (the row must be closed)


# Every per-row device tensor of a ``TextMachine``: what a row carries to another one.
_ROW_STATE = (
    "words",
    "word_len",
    "word_pad",
    "head",
    "count",
    "queued",
    "queued_len",
    "queued_pos",
    "look",
    "look_head",
    "look_count",
    "remaining",
    "forced",
    "end_step",
    "eos",
)


class TextMachine:
    def __init__(self, settings: MachineSettings, batch: int, device: torch.device) -> None:
        self.settings = s = settings
        self.batch = batch
        self.device = device
        w, tokens, look = s.max_words, s.max_word_tokens, s.lookahead_capacity

        def zeros(*shape: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.words = zeros(batch, w, tokens)
        self.word_len = zeros(batch, w)
        self.word_pad = zeros(batch, w)
        self.head = zeros(batch)
        self.count = zeros(batch)
        self.queued = zeros(batch, tokens)
        self.queued_len = zeros(batch)
        self.queued_pos = zeros(batch)
        self.look = zeros(batch, look)
        self.look_head = zeros(batch)
        self.look_count = zeros(batch)
        self.remaining = zeros(batch)
        self.forced = zeros(batch)
        self.end_step = zeros(batch)
        self.eos = zeros(batch, dtype=torch.bool)
        self.rows = torch.arange(batch, device=device)
        # Pushed words wait here and go to the device in one upload before the next step: a word
        # at a time cost several kernels and a device read each (thousands of words a second at
        # 256 streams, on the engine thread). ``_tail``: each row's ring entry for its next word
        # (head + count, counted on the host: no device read).
        self._tail = np.zeros(batch, np.int64)
        self._staged: list[tuple[int, int, list[int], int]] = []  # (row, entry, tokens, padding)
        self._ending: list[int] = []  # rows whose end of stream waits for the next flush, after their words
        # The host's view of each row's pending words (token counts, oldest first) and end, kept
        # through pushes, pops (``popped``, from each step's flags) and ends: whether a row may
        # step is read from it (``ready_host``) with no device read, which would wait for all the
        # work queued on the device (another engine's step included).
        self._lengths: list[deque[int]] = [deque() for _ in range(batch)]
        self._voiced = np.zeros(batch, np.int64)  # pending words with tokens
        self._ended = np.zeros(batch, bool)
        # Whether the row's next step pops no word (``pops_none``), as of the last step read.
        self._pops_none = np.full(batch, s.initial_padding > 0)
        # Whether the row asked for a word it may lack (a tried step put back, or its next step must
        # pop one: ``read_asked``): it tries no step without its words until more text comes.
        self._asked = np.zeros(batch, bool)
        self.reset_rows(torch.ones(batch, dtype=torch.bool, device=device))

    def reset_rows(self, mask: torch.Tensor) -> None:
        s = self.settings
        for tensor in (self.head, self.count, self.queued_len, self.queued_pos, self.look_head, self.look_count):
            tensor.masked_fill_(mask, 0)
        self.remaining.masked_fill_(mask, s.initial_padding)
        self.forced.masked_fill_(mask, s.initial_padding)
        self.end_step.masked_fill_(mask, -1)
        self.eos.masked_fill_(mask, False)

    def take_row(self, row: int, source: TextMachine, source_row: int) -> None:
        """``row`` continues ``source``'s ``source_row``: its words, queues, counters and end (the
        source is flushed first, so no word or end waits on its host side)."""
        source.flush()
        for name in _ROW_STATE:
            getattr(self, name)[row] = getattr(source, name)[source_row]
        self._tail[row] = source._tail[source_row]
        self._lengths[row] = deque(source._lengths[source_row])
        self._voiced[row] = source._voiced[source_row]
        self._ended[row] = source._ended[source_row]
        self._pops_none[row] = source._pops_none[source_row]
        self._asked[row] = source._asked[source_row]

    def first_rows(self, rows: int) -> TextMachine:
        """The first ``rows`` rows' device state as views, for a step over those rows alone
        (docs/engines.md#row-buckets). Words are pushed to and flushed by this machine, before
        the step: the view's host side starts empty, so it never uploads them a second time."""
        view = copy.copy(self)
        view.batch = rows
        for name in _ROW_STATE:
            setattr(view, name, getattr(self, name)[:rows])
        view.rows = self.rows[:rows]
        view._tail, view._voiced, view._ended = self._tail[:rows], self._voiced[:rows], self._ended[:rows]
        view._pops_none, view._asked = self._pops_none[:rows], self._asked[:rows]
        view._lengths = self._lengths[:rows]
        view._staged, view._ending = [], []
        return view

    def forget(self, row: int) -> None:
        """``row`` starts a new stream: the words and end not yet flushed were the old stream's
        (the device state is reset by ``reset_rows`` before the next flush)."""
        self._tail[row] = 0
        self._staged = [word for word in self._staged if word[0] != row]
        self._ending = [ending for ending in self._ending if ending != row]
        self._lengths[row].clear()
        self._voiced[row] = 0
        self._ended[row] = False
        self._pops_none[row] = self.settings.initial_padding > 0
        self._asked[row] = False

    def pending(self, row: int) -> int:
        """Words pushed to ``row`` and not yet popped."""
        return len(self._lengths[row])

    def popped(self, row: int) -> None:
        """A step popped ``row``'s next word (its ``consumed`` flag, read on the host)."""
        if self._lengths[row].popleft():
            self._voiced[row] -= 1

    def read_pops_none(self, rows: npt.NDArray[np.intp], pops_none: npt.NDArray[np.bool_]) -> None:
        """Whether each of ``rows``' next step pops no word, as a step just read said (``pops_none``)."""
        self._pops_none[rows] = pops_none

    def read_asked(
        self, rows: npt.NDArray[np.intp], stepped: npt.NDArray[np.bool_], asked: npt.NDArray[np.bool_]
    ) -> None:
        """What a step just read said of ``rows``: which ``stepped``, and which ``asked`` for a word
        (they tried a step and the model asked for one they lack, or their next step must pop one).
        Such a row waits for text (a push or its end) before it tries a step without its words;
        one that stepped may try its next step unless that one must pop."""
        self._asked[rows] = (self._asked[rows] & ~stepped) | asked

    def asked(self) -> npt.NDArray[np.bool_]:
        """Rows that asked for a word (``read_asked``) and got no text since."""
        return self._asked.copy()

    def push(self, row: int, tokens: list[int], padding: int) -> None:
        """Append one word (``tokens`` may be empty: a pause of ``padding`` steps) to ``row``;
        raises ``ValueError`` past ``max_words`` pending. The device sees it at the next ``flush``."""
        if not self.takes(self.pending(row), tokens):
            raise ValueError("word backlog full or word too long")
        s = self.settings
        self._staged.append((row, int(self._tail[row]), tokens, padding))
        self._tail[row] = (self._tail[row] + 1) % s.max_words
        self._lengths[row].append(len(tokens))
        self._voiced[row] += bool(tokens)
        self._asked[row] = False

    def takes(self, pending: int, tokens: list[int]) -> bool:
        """Whether a row with ``pending`` words queued may queue one more of ``tokens``."""
        return pending < self.settings.max_words and len(tokens) <= self.settings.max_word_tokens

    def flush(self) -> None:
        """Upload the words pushed since the last flush, then the ends (before a step, or reading
        ``ready``)."""
        if self._staged:
            self._upload_words()
        if self._ending:
            ending, self._ending = self._ending, []
            self.eos[torch.tensor(ending, dtype=torch.long).to(self.device)] = True

    def _upload_words(self) -> None:
        staged, self._staged = self._staged, []
        tokens = np.zeros((len(staged), self.settings.max_word_tokens), np.int64)
        for index, (_, _, word, _) in enumerate(staged):
            tokens[index, : len(word)] = word
        columns = [(row, entry, len(word), padding) for row, entry, word, padding in staged]
        rows, entries, lengths, pads = torch.tensor(columns, dtype=torch.long).to(self.device).unbind(1)
        self.words[rows, entries] = torch.from_numpy(tokens).to(self.device)
        self.word_len[rows, entries] = lengths
        self.word_pad[rows, entries] = pads
        self.count.index_add_(0, rows, torch.ones_like(rows))

    def end(self, row: int) -> None:
        """No more words will come for ``row``: it may now run its text out (from the next flush)."""
        self._ending.append(row)
        self._ended[row] = True
        self._asked[row] = False

    def pops_none(self) -> torch.Tensor:
        """``[B]`` bool: rows whose next step pops no word whatever the model predicts (the current
        word has tokens left to feed, or pads are forced): such a step reads no pending word."""
        return (self.queued_pos < self.queued_len) | (self.forced > 0)

    def ready(self) -> torch.Tensor:
        """``[B]`` bool: rows that may step now: the next step pops no word (``pops_none``), or
        (Kyutai's ``is_active``) the text is complete, or the next word is pending together with
        the ``second_stream_ahead`` words after it that carry tokens (a pause needs no lookahead)."""
        self.flush()
        s = self.settings
        enough = self.count > 0
        if s.second_stream_ahead:
            ranks = (torch.arange(s.max_words, device=self.device)[None] - self.head[:, None]) % s.max_words
            pending = ranks < self.count[:, None]
            with_tokens = (pending & (self.word_len > 0)).sum(dim=1)
            first_is_pause = self.word_len[self.rows, self.head] == 0
            enough = enough & (first_is_pause | (with_tokens >= s.second_stream_ahead + 1))
        return self.eos | enough | self.pops_none()

    def ready_host(self) -> npt.NDArray[np.bool_]:
        """``ready`` from the host's view of the rows, with no device read (the same between two
        steps once each step's pops and ``pops_none`` are told: ``popped``, ``read_pops_none``)."""
        ahead = self.settings.second_stream_ahead
        pending = np.array([len(words) for words in self._lengths]) > 0
        if ahead == 0:
            enough = pending
        else:
            first_is_pause = np.array([bool(words) and words[0] == 0 for words in self._lengths])
            enough = pending & (first_is_pause | (self._voiced >= ahead + 1))
        ready: npt.NDArray[np.bool_] = self._ended | enough | self._pops_none
        return ready

    def must_pop(self) -> torch.Tensor:
        """``[B]`` bool: rows whose next step pops a word whatever the model predicts (``max_padding``
        pads in a row, or a stream's first word after its first pads)."""
        return ~self.pops_none() & (self.remaining <= 0)

    def asks_word(self, sampled: torch.Tensor) -> torch.Tensor:
        """``[B]`` bool: rows whose step, given the ``sampled`` text token, would pop a word (the
        model asked for one, or must): only these read the pending words (a row that lacks them
        and asks must wait for them). Every other row's step feeds a pad."""
        return ~self.pops_none() & ((self.remaining <= 0) | (sampled == self.settings.ids.new_word))

    def step(self, sampled: torch.Tensor, step: torch.Tensor, execute: torch.Tensor) -> MachineStep:
        """``sampled`` ``[B]`` text tokens the model predicted, ``step`` ``[B]`` each row's step
        index; only rows in ``execute`` change state."""
        s, ids, rows = self.settings, self.settings.ids, self.rows
        new_word = torch.full_like(sampled, ids.new_word)
        pad = torch.full_like(sampled, ids.pad)
        wants_word = self.asks_word(sampled)
        token = torch.where(wants_word, new_word, pad)
        pop = wants_word & (self.count > 0) & execute
        entry_tokens = self.words[rows, self.head]  # [B, L]
        entry_len = self.word_len[rows, self.head]
        entry_pad = self.word_pad[rows, self.head]
        spoken = pop & (entry_len > 0)
        # The queue is empty whenever a word is popped (a pending token forces a pad).
        self.queued.copy_(torch.where(spoken[:, None], entry_tokens, self.queued))
        self.queued_len.copy_(torch.where(spoken, entry_len, self.queued_len))
        self.queued_pos.masked_fill_(spoken, 0)
        self.head.copy_(torch.where(pop, (self.head + 1) % s.max_words, self.head))
        self.count.sub_(pop.long())
        overflow = torch.zeros_like(pop)
        if s.second_stream_ahead:
            overflow = self._queue_lookahead(spoken)
        self.remaining.copy_(torch.where(spoken, torch.full_like(self.remaining, s.max_padding), self.remaining))
        token = torch.where(pop & ~spoken, pad, token)  # a pause entry: as if the model padded
        self.forced.copy_(torch.where(pop, entry_pad, self.forced))
        # Asking for a word with none pending: the text has run out.
        out_of_text = wants_word & (self.count == 0) & ~pop
        first_end = out_of_text & (self.end_step < 0)
        token = torch.where(out_of_text, pad, token)
        if s.second_stream_ahead:
            token = torch.where(first_end, new_word, token)
        self.end_step.copy_(torch.where(first_end & execute, step, self.end_step))

        is_pad = token == ids.pad
        dec = is_pad & execute
        self.remaining.sub_((dec & (self.remaining > 0)).long())
        self.forced.sub_((dec & (self.forced > 0)).long())
        has_queued = self.queued_pos < self.queued_len
        next_queued = self.queued[rows, self.queued_pos.clamp(max=s.max_word_tokens - 1)]
        take = is_pad & has_queued
        output = torch.where(is_pad, torch.where(has_queued, next_queued, pad), new_word)
        self.queued_pos.add_((take & execute).long())
        if s.second_stream_ahead:
            output = self._mux(output, execute)
        return MachineStep(output, pop, overflow & execute)

    def _queue_lookahead(self, spoken: torch.Tensor) -> torch.Tensor:
        """Append, for rows that just popped a word, the tokens of the word ``second_stream_ahead``
        words further on (counting words with tokens) to the lookahead queue."""
        s = self.settings
        w, cap = s.max_words, s.lookahead_capacity
        ranks = (torch.arange(w, device=self.device)[None] - self.head[:, None]) % w  # head already moved
        pending = (ranks < self.count[:, None]) & (self.word_len > 0)
        # Order of each pending worded entry among the pending worded entries, by rank.
        order = torch.where(pending, ranks, torch.full_like(ranks, w))
        sorted_ranks, slots = order.sort(dim=1)
        valid = sorted_ranks[:, s.second_stream_ahead - 1] < w if s.second_stream_ahead <= w else spoken & False
        slot = slots[:, s.second_stream_ahead - 1]
        add = spoken & valid
        length = torch.where(add, self.word_len[self.rows, slot], torch.zeros_like(self.look_count))
        overflow = add & (self.look_count + length > cap)
        positions = torch.arange(s.max_word_tokens, device=self.device)
        write = (positions[None] < length[:, None]) & ~overflow[:, None]
        where = (self.look_head + self.look_count)[:, None] + positions[None]
        values = self.words[self.rows, slot]
        index = where % cap
        current = self.look.gather(1, index)
        self.look.scatter_(1, index, torch.where(write, values, current))
        self.look_count.add_(torch.where(overflow, torch.zeros_like(length), length))
        return overflow

    def _mux(self, output: torch.Tensor, execute: torch.Tensor) -> torch.Tensor:
        s, ids, rows = self.settings, self.settings.ids, self.rows
        is_word = output == ids.new_word
        has_queued = self.queued_pos < self.queued_len
        next_queued = self.queued[rows, self.queued_pos.clamp(max=s.max_word_tokens - 1)]
        # The word marker moves to the second stream; the first carries the word's next token.
        first = torch.where(is_word, torch.where(has_queued, next_queued, torch.full_like(output, ids.pad)), output)
        self.queued_pos.add_((is_word & has_queued & execute).long())
        has_look = self.look_count > 0
        look_next = self.look[rows, self.look_head]
        second = torch.where(is_word, torch.full_like(output, ids.new_word), torch.where(has_look, look_next, -1))
        pop_look = ~is_word & has_look & execute
        self.look_head.copy_(torch.where(pop_look, (self.look_head + 1) % s.lookahead_capacity, self.look_head))
        self.look_count.sub_(pop_look.long())
        return (second + 1) * ids.card + first
