"""Conversation history of one session, with playback-aligned commits (docs/sessions.md#playback-acknowledgement).

Items keep their position from the moment they are created. What an assistant item
contributes to history (``committed_text``) follows what the client actually heard:

* ``ack_only``: the prefix of the text proportional to the acknowledged audio
  (``committed_ms / audio_ms``); text-only responses commit whole when done;
* ``commit_all_on_done``: the whole text when the response completes; on cancel or
  barge-in the part played so far when the client acknowledged playback, else all text
  generated so far; a truncation (``conversation.item.truncate`` or a truncating ack)
  always cuts to what was heard.

A failed response never enters history: its item is removed.

Function calling: a ``function_call`` item (``text`` = its JSON arguments) enters history
as an assistant call once complete; a ``function_call_output`` item (``text`` = the
client's result) as the ``tool`` message answering that call.

The conversation is bounded (``sessions.max_conversation_items`` / ``_bytes``, issue 17):
``admits`` says whether a client item still fits; items the session makes itself (turns,
responses) are not refused, they are bounded by the turns that make them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rtserve.engines.values import ChatMessage, ToolCall
from rtserve.sessions.events import ItemSnapshot
from rtserve.sessions.session_config import PlaybackCommitPolicy

Role = Literal["user", "assistant", "system"]
Outcome = Literal["completed", "cancelled", "failed", "incomplete"]


def spoken_prefix(text: str, heard_ms: float, audio_ms: float) -> str:
    """The share of ``text`` matching ``heard_ms`` of ``audio_ms`` (whole text without audio)."""
    if audio_ms <= 0:
        return text
    return text[: int(len(text) * min(1.0, max(0.0, heard_ms) / audio_ms))]


@dataclass(eq=False)
class ConversationItem:
    id: str
    role: Role
    kind: Literal["audio", "text", "function_call", "function_call_output"]
    text: str | None = None  # transcript / generated text; None while a transcript is pending
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    committed_text: str | None = None  # what the engine sees as history; None = not in history
    turn_id: int = 0  # the session turn when the item was created
    audio_ms: float = 0.0  # agent audio sent, or user audio committed
    # assistant items only
    response_id: str | None = None
    played_ms: int = 0
    committed_ms: int = 0
    truncated_ms: int | None = None
    # function items only
    call_id: str | None = None
    name: str | None = None
    images: tuple[str, ...] = ()  # user items: JPEG data URLs (camera frames, input_image parts)

    def snapshot(self) -> ItemSnapshot:
        return ItemSnapshot(
            id=self.id,
            role=self.role,
            kind=self.kind,
            text=self.text,
            status=self.status,
            call_id=self.call_id,
            name=self.name,
        )

    def acknowledge(self, played_ms: int, committed_ms: int, policy: PlaybackCommitPolicy) -> bool:
        """Record playback progress; True when history changed."""
        audio = int(self.audio_ms)
        self.played_ms = max(self.played_ms, min(played_ms, audio))
        self.committed_ms = max(self.committed_ms, min(committed_ms, audio))
        if policy != "ack_only":
            return False
        return self._set_committed(spoken_prefix(self.text or "", self.committed_ms, self.audio_ms))

    def truncate(self, heard_ms: int) -> None:
        self.truncated_ms = heard_ms
        if self.committed_text is not None or self.status != "in_progress":
            self.committed_text = spoken_prefix(self.text or "", heard_ms, self.audio_ms)

    def settle(self, outcome: Outcome, policy: PlaybackCommitPolicy) -> None:
        """The response ended: fix what enters history."""
        self.status = "completed" if outcome == "completed" else "incomplete"
        text = self.text or ""
        if self.truncated_ms is not None:
            self.committed_text = spoken_prefix(text, self.truncated_ms, self.audio_ms)
        elif policy == "ack_only" and self.audio_ms > 0:
            self.committed_text = spoken_prefix(text, self.committed_ms, self.audio_ms)
        elif outcome == "cancelled" and self.played_ms > 0:
            self.committed_text = spoken_prefix(text, self.played_ms, self.audio_ms)
        else:
            self.committed_text = text

    def _set_committed(self, text: str) -> bool:
        changed = text != (self.committed_text or "")
        self.committed_text = text
        return changed


class Conversation:
    def __init__(self, *, max_items: int, max_bytes: int, max_images: int = 8) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.max_images = max_images  # sessions.max_conversation_images: older images are dropped
        self._items: list[ConversationItem] = []
        self._by_id: dict[str, ConversationItem] = {}
        self._by_response: dict[str, ConversationItem] = {}

    def __contains__(self, item_id: str) -> bool:
        return item_id in self._by_id

    def get(self, item_id: str) -> ConversationItem | None:
        return self._by_id.get(item_id)

    def for_response(self, response_id: str) -> ConversationItem | None:
        return self._by_response.get(response_id)

    def has_call(self, call_id: str) -> bool:
        return any(item.kind == "function_call" and item.call_id == call_id for item in self._items)

    def admits(self, text: str) -> bool:
        """Whether one more item holding ``text`` stays within the item and byte bounds."""
        if len(self._items) >= self.max_items:
            return False
        held = sum(len((item.text or "").encode()) for item in self._items)  # at most max_bytes plus the last turn
        return held + len(text.encode()) <= self.max_bytes

    def last_id(self) -> str | None:
        return self._items[-1].id if self._items else None

    def add(self, item: ConversationItem, previous_item_id: str | None = None) -> str | None:
        """Insert after ``previous_item_id`` (None: at the end); returns the id before it.
        Raises ``KeyError`` for an unknown ``previous_item_id``."""
        if previous_item_id is None:
            previous = self.last_id()
            self._items.append(item)
        else:
            index = next((i for i, it in enumerate(self._items) if it.id == previous_item_id), None)
            if index is None:
                raise KeyError(previous_item_id)
            previous = previous_item_id
            self._items.insert(index + 1, item)
        self._by_id[item.id] = item
        if item.response_id is not None:
            self._by_response[item.response_id] = item
        return previous

    def show(self, item: ConversationItem, images: tuple[str, ...]) -> None:
        """Attach ``images`` to ``item``; beyond ``max_images`` in the conversation the oldest go
        (their items keep their text), so a long video call holds a bounded number of frames."""
        item.images = (*item.images, *images)
        excess = sum(len(it.images) for it in self._items) - self.max_images
        for older in self._items:
            if excess <= 0:
                break
            dropped = min(excess, len(older.images))
            older.images = older.images[dropped:]
            excess -= dropped

    def remove(self, item_id: str) -> ConversationItem | None:
        item = self._by_id.pop(item_id, None)
        if item is not None:
            self._items.remove(item)
            if item.response_id is not None:
                self._by_response.pop(item.response_id, None)
        return item

    def history(self) -> tuple[ChatMessage, ...]:
        """Committed messages in conversation order (what the engine is given)."""
        out = []
        for item in self._items:
            if item.kind == "function_call":
                if item.status == "completed":
                    call = ToolCall(item.call_id or "", item.name or "", item.text or "")
                    out.append(ChatMessage(role="assistant", content="", tool_calls=(call,)))
                continue
            if item.kind == "function_call_output":
                out.append(ChatMessage(role="tool", content=item.text or "", tool_call_id=item.call_id))
                continue
            text = item.committed_text if item.role == "assistant" else item.text
            if text or item.images:
                out.append(ChatMessage(role=item.role, content=text or "", images=item.images))
        return tuple(out)
