"""Does the embedded voice agent answer 20 short spoken questions sensibly? Scored by a rubric in code.

Each question is spoken by the project's Piper voice (``TextToSpeech``), transcribed by the
project's Whisper (``WhisperAsr``), and the transcript is asked of the cascade LLM with the
voice agent's own system prompt (``instructions.DEFAULT_INSTRUCTIONS``), as a voice turn is. The
same transcripts go to every LLM configuration, side by side in one run:

* ``before``: today's runtime (transformers) at today's sampling (the realtime session's
  default temperature 0.8, top_p 1.0, no ceiling);
* ``after``: the configured defaults (``cascade.llm_runtime`` and the sampling ceilings
  ``cascade.llm_max_temperature`` / ``llm_max_top_p``), requests still asking for 0.8;
* with ``--all``, the other two combinations, to tell the runtime's part from the sampling's;
* with ``--compare`` (issue 34) instead: the configured defaults against each other choice of
  CTranslate2 compute type (``cascade.llm_compute_type``) and system prompt
  (``PROMPTS``), all on the same transcripts, and then the best of those on the transcripts
  of each ``--asr`` model (``NAME=PATH``, a faster-whisper folder), with each model's word
  error rate on the 20 questions and median decode time;
* with ``--ceilings 0.3,0.1,0`` instead: the configured defaults at each temperature ceiling
  (``cascade.llm_max_temperature``; 0 decodes greedily, so its draws agree).

Rubric (``RUBRIC`` below; no judging by eye). An answer passes when ALL of these hold:

1. ``need``: every group matches (a group is a regex of accepted alternatives, matched
   case-insensitively on word boundaries); ``need_count`` asks that many distinct matches
   of one group (e.g. three colour names);
2. ``avoid``: no regex matches (wrong answers that small models like to give), nor any of
   ``ALWAYS_AVOID`` (markup and lists the voice prompt forbids, leaked chat-template tokens);
3. length: between 1 and ``MAX_WORDS`` words, and the reply ended by itself (finish
   ``stop``, not ``length`` at ``MAX_TOKENS``): a voice answer is one or two short sentences.

Each question is asked ``DRAWS`` times per configuration, without a seed (as voice
sessions ask: a seed would send a CTranslate2 request to transformers); the score is
20 x passes / asked (20 = every question right every time). Sampling makes two runs differ
by a point or so. Run:
``.venv/bin/python benchmarks/bench_answer_quality.py [--json PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig, load_config
from rtserve.engines.cascade.asr import SAMPLE_RATE as ASR_RATE
from rtserve.engines.cascade.asr import WhisperAsr
from rtserve.engines.cascade.audio import resample
from rtserve.engines.cascade.instructions import ANSWER_RULE, DEFAULT_INSTRUCTIONS
from rtserve.engines.cascade.llm_runtime import create_llm
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.model_paths import resolve_asr, resolve_tts
from rtserve.engines.cascade.tts import TextToSpeech
from rtserve.engines.values import ChatMessage, SamplingParams

DEFAULT_RESULTS = Path(__file__).parent / "results" / "bench_answer_quality.json"
SESSION_TEMPERATURE = 0.8  # the realtime session's default (sessions/session_config.py)
DRAWS = 2  # answers sampled per question and configuration
MAX_TOKENS = 80
MAX_WORDS = 45
ALWAYS_AVOID = (r"\*\*", r"^\s*[-*#]\s", r"^\s*\d+\.\s", r"<\|", r"\bassistant\s*:", r"\buser\s*:")


@dataclass(frozen=True)
class Question:
    text: str
    need: tuple[str, ...] = ()
    avoid: tuple[str, ...] = ()
    need_count: int = 1  # distinct matches the last ``need`` group must have


COLOURS = r"red|blue|green|yellow|orange|purple|pink|black|white|brown|gr[ae]y|violet"
NUMBERS_1_5 = (r"one|1", r"two|2", r"three|3", r"four|4", r"five|5")
RUBRIC: tuple[Question, ...] = (
    # Factual
    Question("What is the capital of France?", (r"paris",), (r"london|berlin|rome|madrid|lyon",)),
    Question("How many days are there in a week?", (r"seven|7",), (r"\b(five|six|eight|5|6|8) days",)),
    Question("What color is the sky on a clear day?", (r"blue",), (r"\bgreen sky|\bred sky",)),
    Question(
        "What is the largest planet in our solar system?",
        (r"jupiter",),
        (r"(neptune|saturn|uranus|earth|mars) is the largest",),
    ),
    Question("Which animal is known as the king of the jungle?", (r"lions?",), (r"tiger is|elephant is",)),
    Question("What do bees make?", (r"honey",)),
    Question("How many legs does a spider have?", (r"eight|8",), (r"\b(six|ten|6|10) legs",)),
    Question("At what temperature in Celsius does water freeze?", (r"zero|0",), (r"\b100 degrees|\bhundred",)),
    Question("Who wrote Romeo and Juliet?", (r"shakespeare",), (r"dickens|french playwright",)),
    Question("What is the opposite of hot?", (r"cold",)),
    Question("What gas do plants take in from the air?", (r"carbon dioxide|co2",), (r"plants take in oxygen",)),
    Question("What is two plus three?", (r"five|5",), (r"\b(four|six|4|6)\b(?! plus)",)),
    # Instruction-following
    Question("Say hello to my friend Anna.", (r"hello|hi|hey", r"anna")),
    Question(
        "Give me one word that rhymes with cat.", (r"hat|bat|mat|rat|sat|fat|pat|chat|flat|vat|gnat|brat|spat|splat",)
    ),
    Question("Name three colors.", (COLOURS,), need_count=3),
    Question(
        "Tell me a fruit that is yellow.",
        (r"bananas?|lemons?|pineapples?|mangos?|mangoes",),
        (r"\b(apple|strawberr(y|ies)|cherr(y|ies)|grapes?) (is|are) yellow",),
    ),
    Question("What day comes after Monday?", (r"tuesday",), (r"(sunday|wednesday) comes after monday",)),
    Question("Count from one to five.", NUMBERS_1_5, (r"\bsix\b|\b6\b",)),
    Question("Answer with yes or no. Is the sun hot?", (r"yes",), (r"^\W*no\b",)),
    Question("Please tell me a short greeting for the morning.", (r"good morning|morning",)),
)
# Questions no prompt was tuned on (``--questions held-out``): a change of the system prompt that
# gains on RUBRIC should gain here too, or it learned the rubric rather than how to answer.
HELD_OUT: tuple[Question, ...] = (
    Question("What is the capital of Italy?", (r"rome",), (r"paris|milan|venice",)),
    Question("How many months are there in a year?", (r"twelve|12",), (r"\b(ten|eleven|thirteen|10|11|13) months",)),
    Question("What color is grass?", (r"green",)),
    Question("What animal says moo?", (r"cows?",)),
    Question("What is the opposite of up?", (r"down",)),
    Question("How many wheels does a bicycle have?", (r"two|2",), (r"\b(three|four|3|4) wheels",)),
    Question("What is ten minus four?", (r"six|6",)),
    Question("What season comes after winter?", (r"spring",), (r"(summer|autumn|fall) comes after winter",)),
    Question("Which is bigger, an elephant or a mouse?", (r"elephants?",), (r"mouse is bigger",)),
    Question("What is frozen water called?", (r"ice",)),
    Question("What language is spoken in Spain?", (r"spanish",)),
    Question("How many minutes are there in an hour?", (r"sixty|60",)),
    Question(
        "Name two kinds of fruit.",
        (r"apples?|bananas?|oranges?|grapes?|pears?|peach(es)?|cherr(y|ies)|lemons?",),
        need_count=2,
    ),
    Question("Say good night to my brother Tom.", (r"good ?night", r"tom")),
    Question("Spell the word dog.", (r"d\W*o\W*g",)),
)
QUESTION_SETS = {"rubric": RUBRIC, "held-out": HELD_OUT}


def score(question: Question, answer: str, finish: str | None) -> list[str]:
    """The rubric's complaints about ``answer`` (empty: it passes)."""
    problems = []
    words = len(answer.split())
    if not 1 <= words <= MAX_WORDS:
        problems.append(f"{words} words")
    if finish != "stop":
        problems.append(f"finish {finish}")
    for index, group in enumerate(question.need):
        hits = {m.group(0).lower() for m in re.finditer(rf"\b(?:{group})\b", answer, re.IGNORECASE)}
        wanted = question.need_count if index == len(question.need) - 1 else 1
        if len(hits) < wanted:
            problems.append(f"needs /{group}/" + (f" x{wanted}" if wanted > 1 else ""))
    for pattern in (*question.avoid, *ALWAYS_AVOID):
        if re.search(pattern, answer, re.IGNORECASE | re.MULTILINE):
            problems.append(f"has /{pattern}/")
    return problems


@dataclass(frozen=True)
class Variant:
    name: str
    runtime: str
    capped: bool  # the sampling ceilings of the configured defaults; else none (today)
    compute_type: str | None = None  # cascade.llm_compute_type; None: the configured one
    instructions: str = DEFAULT_INSTRUCTIONS  # the voice session's system prompt
    heard_by: str = ""  # which ASR's transcripts it answers ("": the configured model's)
    max_temperature: float | None = None  # cascade.llm_max_temperature; None: the configured one


VARIANTS = (
    Variant("before: transformers, t=0.8 uncapped", "transformers", False),
    Variant("after: ctranslate2, capped defaults", "ctranslate2", True),
)
MIXED = (
    Variant("transformers, capped defaults", "transformers", True),
    Variant("ctranslate2, t=0.8 uncapped", "ctranslate2", False),
)


# System prompts --compare tries: the default, it without its answer examples, the one before issue 34,
# another short one.
PREVIOUS_INSTRUCTIONS = (
    "You are a friendly voice assistant. Answer in one or two short, plain spoken sentences, without lists or markup."
)
PROMPTS = {
    "default": DEFAULT_INSTRUCTIONS,
    "no examples": f"You are a helpful assistant. {ANSWER_RULE}",  # the default before its answer examples
    "previous": PREVIOUS_INSTRUCTIONS,
    "plain": "Answer the user's question correctly, in one short spoken sentence.",
}


def config_for(variant: Variant) -> ServerConfig:
    cascade: dict[str, object] = {"llm_runtime": variant.runtime}
    if not variant.capped:
        cascade.update(llm_max_temperature=2.0, llm_max_top_p=1.0)
    if variant.compute_type is not None:
        cascade["llm_compute_type"] = variant.compute_type
    if variant.max_temperature is not None:
        cascade["llm_max_temperature"] = variant.max_temperature
    return load_config(environ={}, overrides={"cascade": cascade})


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(word edits, reference words) between two texts, case and punctuation ignored."""
    ref, hyp = (re.findall(r"[a-z0-9']+", text.lower()) for text in (reference, hypothesis))
    row = list(range(len(hyp) + 1))
    for i, word in enumerate(ref, 1):
        diagonal, row[0] = row[0], i
        for j, heard in enumerate(hyp, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (word != heard))
    return row[-1], len(ref)


def word_error_rate(questions: tuple[Question, ...], heard: list[str]) -> float:
    edits, words = map(sum, zip(*(word_errors(q.text, h) for q, h in zip(questions, heard, strict=True)), strict=True))
    return edits / words


async def timed_transcripts(config: ServerConfig, questions: tuple[Question, ...]) -> tuple[list[str], float]:
    """Each question spoken by Piper and heard by Whisper (as a voice turn: the short window),
    and the median decode time (s)."""
    metrics = CascadeMetrics(CollectorRegistry())
    tts = TextToSpeech(resolve_tts(config.models), cpu_threads=config.models.cpu_threads, max_queue=64, metrics=metrics)
    asr = WhisperAsr(
        resolve_asr(config.models),
        cpu_threads=config.models.cpu_threads,
        max_queue=64,
        partial_interval_ms=config.cascade.asr_partial_interval_ms,
        max_audio_s=config.cascade.max_turn_audio_s,
        window_s=config.cascade.asr_window_s,
        metrics=metrics,
    )
    await asyncio.gather(tts.start(), asr.start())
    heard, seconds = [], []
    try:
        for question in questions:
            audio = resample(
                np.concatenate([chunk async for chunk in tts.synthesize(question.text)]), tts.sample_rate, ASR_RATE
            )
            started = time.perf_counter()
            heard.append(await asr.decode(audio, final=True, live_turn=True))
            seconds.append(time.perf_counter() - started)
    finally:
        tts.stop()
        asr.stop()
    return heard, float(np.median(seconds))


async def ask_all(
    variant: Variant, questions: tuple[Question, ...], heard: list[str], draws: int = DRAWS
) -> dict[str, object]:
    config = config_for(variant)
    llm = create_llm(config, CascadeMetrics(CollectorRegistry()))
    await llm.start()

    async def ask(text: str) -> tuple[str, str | None]:
        messages = (ChatMessage("system", variant.instructions), ChatMessage("user", text))
        params = SamplingParams(temperature=SESSION_TEMPERATURE, max_tokens=MAX_TOKENS)
        deltas = [d async for d in llm.generate(messages, params, fit_history=True)]
        return "".join(d.text for d in deltas).strip(), deltas[-1].finish_reason

    started = time.perf_counter()
    try:
        rows = []
        for draw in range(draws):
            answers = await asyncio.gather(*(ask(text) for text in heard))
            for question, text, (answer, finish) in zip(questions, heard, answers, strict=True):
                rows.append(
                    {
                        "question": question.text,
                        "heard": text,
                        "draw": draw,
                        "answer": answer,
                        "finish": finish,
                        "problems": score(question, answer, finish),
                    }
                )
    finally:
        llm.stop()
    passed = sum(not row["problems"] for row in rows)
    return {
        "variant": variant.name,
        "compute_type": config.cascade.llm_compute_type,
        "instructions": variant.instructions,
        "score": 20 * passed / len(rows),
        "passed": passed,
        "asked": len(rows),
        "seconds": time.perf_counter() - started,
        "rows": rows,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--show", action="store_true", help="print every answer and the rubric's complaints")
    parser.add_argument("--all", action="store_true", help="also the runtime/sampling cross combinations")
    parser.add_argument("--compare", action="store_true", help="compute types, prompts and --asr models (issue 34)")
    parser.add_argument("--asr", action="append", default=[], help="with --compare: NAME=PATH of another Whisper")
    parser.add_argument("--questions", choices=QUESTION_SETS, default="rubric", help="which questions are asked")
    parser.add_argument(
        "--compute-types", default="int8,int8_float32,float32", help="with --compare: the LLM compute types tried"
    )
    parser.add_argument("--draws", type=int, default=DRAWS, help="answers sampled per question and configuration")
    parser.add_argument(
        "--ceilings",
        help="instead: the configured defaults at each of these temperature ceilings "
        "(cascade.llm_max_temperature, comma-separated; 0: greedy)",
    )
    args = parser.parse_args()
    questions = QUESTION_SETS[args.questions]
    base_config = config_for(VARIANTS[0])
    heard, decode_s = await timed_transcripts(base_config, questions)
    hearing = {"": (heard, decode_s)}
    for option in args.asr:
        name, _, path = option.partition("=")
        other = base_config.model_copy(update={"models": base_config.models.model_copy(update={"asr": path})})
        hearing[name] = await timed_transcripts(other, questions)
    for name, (texts, seconds) in hearing.items():
        print(
            f"ASR {name or base_config.models.asr or 'default'}: "
            f"word error rate {100 * word_error_rate(questions, texts):.1f}%, "
            f"median decode {1000 * seconds:.0f} ms",
            flush=True,
        )
    variants: list[Variant] = [*VARIANTS, *(MIXED if args.all else ())]
    if args.compare:
        variants = [
            Variant(f"{compute}, prompt {prompt}", "ctranslate2", True, compute, PROMPTS[prompt])
            for compute in args.compute_types.split(",")
            for prompt in PROMPTS
        ]
    if args.ceilings:
        variants = [
            Variant(f"ctranslate2, ceiling {ceiling}", "ctranslate2", True, max_temperature=float(ceiling))
            for ceiling in args.ceilings.split(",")
        ]
    results = []
    for variant in variants:
        results.append(await ask_all(variant, questions, hearing[variant.heard_by][0], args.draws))
        print(f"measured {variant.name}: {results[-1]['score']:.1f} / 20", flush=True)
    if args.compare and len(hearing) > 1:
        best = max(zip(variants, results, strict=True), key=lambda pair: float(pair[1]["score"]))[0]  # type: ignore[arg-type]
        for name in hearing:
            if name:
                variant = Variant(
                    f"{best.name}, heard by {name}", "ctranslate2", True, best.compute_type, best.instructions, name
                )
                variants.append(variant)
                results.append(await ask_all(variant, questions, hearing[name][0], args.draws))
                print(f"measured {variant.name}: {results[-1]['score']:.1f} / 20", flush=True)
    capped = load_config(environ={}).cascade
    print(
        f"machine: {platform.node()} {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}; "
        f"{len(questions)} spoken questions ({args.questions}) x {args.draws} draws, "
        f"requests at temperature {SESSION_TEMPERATURE}; "
        f"capped = llm_max_temperature {capped.llm_max_temperature}, llm_max_top_p {capped.llm_max_top_p}"
    )
    print(f"{'configuration':56} {'score /20':>9} {'passed':>8} {'seconds':>8}")
    for result in results:
        print(
            f"{result['variant']:56} {result['score']:9.1f} {result['passed']:>4}/{result['asked']:<3} "
            f"{result['seconds']:8.1f}"
        )
    if args.show:
        for result in results:
            print(f"\n== {result['variant']}")
            for row in result["rows"]:  # type: ignore[attr-defined]
                mark = "ok " if not row["problems"] else "BAD"
                print(f"{mark} [{row['draw']}] {row['heard']!r} -> {row['answer']!r} {row['problems'] or ''}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "machine": platform.node(),
                "cpus": os.cpu_count(),
                "load": os.getloadavg()[0],
                "heard": heard,
                "asr": {
                    name or "default": {
                        "heard": texts,
                        "word_error_rate": word_error_rate(questions, texts),
                        "median_decode_s": s,
                    }
                    for name, (texts, s) in hearing.items()
                },
                "results": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
