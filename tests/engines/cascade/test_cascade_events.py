"""The engine -> session event channel: control lane first, epoch fencing, backpressure."""

from __future__ import annotations

import asyncio

import numpy as np

from rtserve.engines.cascade.events import EventChannel
from rtserve.engines.events import (
    InputTranscript,
    OutputAudio,
    OutputText,
    ResponseFinished,
    SpeechStarted,
    transcript_growth,
)


def audio(epoch: int, samples: int = 100) -> OutputAudio:
    return OutputAudio(np.zeros(samples, np.float32), epoch, "r")


async def test_input_events_overtake_queued_reply_audio() -> None:
    channel = EventChannel(max_output_samples=10_000)
    await channel.put_output(audio(0))
    channel.put_control(SpeechStarted(120))
    assert await channel.get() == SpeechStarted(120)
    assert isinstance(await channel.get(), OutputAudio)


async def test_fence_purges_older_reply_output_and_refuses_later_puts() -> None:
    channel = EventChannel(max_output_samples=10_000)
    await channel.put_output(audio(0))
    await channel.put_output(OutputText("hi", 0, "r"))
    await channel.put_output(audio(1))
    channel.fence(1)
    await channel.put_output(audio(0))
    channel.put_finished(ResponseFinished("r", 0, "cancelled"))
    event = await channel.get()
    assert isinstance(event, OutputAudio) and event.epoch == 1
    channel.close()
    assert await channel.get() is None


async def test_reply_output_waits_for_space_and_a_fence_releases_the_waiter() -> None:
    channel = EventChannel(max_output_samples=150)
    await channel.put_output(audio(0))
    await channel.put_output(audio(0))  # 200 queued: over the bound from now on
    blocked = asyncio.create_task(channel.put_output(audio(0)))
    await asyncio.sleep(0.01)
    assert not blocked.done()
    await channel.get()  # 100 left: room again
    await asyncio.wait_for(blocked, 1)
    assert channel.queued_samples == 200
    waiting = asyncio.create_task(channel.put_output(audio(0)))
    await asyncio.sleep(0.01)
    channel.fence(1)  # the waiter's epoch is now stale: it returns without queueing
    await asyncio.wait_for(waiting, 1)
    assert channel.queued_samples == 0


async def test_unread_partials_merge_into_the_text_they_add() -> None:
    channel = EventChannel(max_output_samples=100)
    channel.put_control(InputTranscript("what", final=False))
    channel.put_control(InputTranscript(" is", final=False))
    channel.put_control(InputTranscript("what is it", final=True))
    assert await channel.get() == InputTranscript("what is", final=False)
    assert await channel.get() == InputTranscript("what is it", final=True)


def test_a_partial_adds_only_what_the_hypothesis_grew_by() -> None:
    """Whisper re-decodes the whole utterance; clients append deltas: the first hypothesis goes
    out whole, a longer one only its new end, one that revised sent words nothing."""
    assert transcript_growth("", "What is") == "What is"
    assert transcript_growth("What is", "What is the capital") == " the capital"
    assert transcript_growth("What is the capital", "What's the capital of") == ""
    assert transcript_growth("What is", "What is") == ""
