"""How soon a Kyutai TTS reply could make its first audio if the model stepped the instant its
text allows: the text-arrival floor under first audio (issue 33, benchmarks/notes/kyutai_served.md).

A row steps only while it holds the next word and ``second_stream_ahead`` more after it, and the
steps inside the audio delay already speak words. This drives rtserve's own ``TextMachine`` with
the tts-1.6b-en_fr settings (two words of lookahead, at most 8 pads, 2 initial), words of
``--word-tokens`` tokens (each followed by the pads the script splitter forces after it) sent at
each ``--words-per-s`` from t=0, and the model's text prediction
replaced by one of two speakers: one that never asks for a word (as random weights behave: a word
is forced after ``max_padding`` pads, ~10 steps a word) and one that asks at every step (the
fastest speech the machine allows). Prints, per rate and speaker, when the step that makes the
first audio (``--young-steps`` + 1) could run and how many words had to be sent by then, with the
engine's tried steps (a young row without its words steps on unless the model asks for one,
``tts_engine.tried_steps``) and without them (it waits at every step that may pop a word).

    .venv/bin/python benchmarks/tts_text_floor.py
    .venv/bin/python benchmarks/tts_text_floor.py --words-per-s 10 15 30 --young-steps 18
"""

from __future__ import annotations

import argparse

import torch

from rtserve.engines.kyutai_tts.machine import MachineSettings, TextMachine, TokenIds

IDS = TokenIds(card=8001, pad=3)
SPEAKERS = {"never asks (random weights)": IDS.pad, "asks every step": IDS.new_word}


def first_audio_floor(
    words_per_s: float, sampled: int, young_steps: int, word_tokens: int, *, tried: bool
) -> tuple[float, int]:
    """(seconds after the first word when step ``young_steps + 1`` can run, words sent by then)."""
    settings = MachineSettings(IDS, second_stream_ahead=2, max_padding=8, initial_padding=2)
    machine = TextMachine(settings, 1, torch.device("cpu"))
    now, sent, steps = 0.0, 0, 0
    while steps <= young_steps:
        while sent / words_per_s <= now + 1e-9:
            # the pads ``ScriptSplitter`` forces after a word (tts_engine.padding_between = 1)
            machine.push(0, [100 + k for k in range(word_tokens)], word_tokens)
            sent += 1
        token = torch.tensor([sampled])
        if bool(machine.ready()[0]) or (tried and not bool(machine.asks_word(token)[0])):
            step = machine.step(token, torch.tensor([steps]), torch.tensor([True]))
            if bool(step.consumed[0]):
                machine.popped(0)  # the host's view of the row's pending words (the engine reads it)
            steps += 1
        else:
            now = sent / words_per_s  # nothing to do until the next word arrives
    return now, sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words-per-s", type=float, nargs="+", default=[15.0, 30.0, 1000.0])
    parser.add_argument("--young-steps", type=int, default=18, help="steps before the first audio (tts-1.6b: 16 + 2)")
    parser.add_argument("--word-tokens", type=int, default=2)
    args = parser.parse_args()
    print(f"{'words/s':>8} {'speaker':>28} {'tried steps':>12} {'first audio step at ms':>23} {'words sent':>11}")
    for rate in args.words_per_s:
        for name, sampled in SPEAKERS.items():
            for tried in (False, True):
                at, sent = first_audio_floor(rate, sampled, args.young_steps, args.word_tokens, tried=tried)
                print(f"{rate:>8.0f} {name:>28} {'on' if tried else 'off':>12} {1000 * at:>23.0f} {sent:>11}")


if __name__ == "__main__":
    main()
