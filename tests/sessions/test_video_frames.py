"""The bounds on images a session holds (docs/video.md#frames-in-the-conversation): the frame
window keeps the newest ``max_video_frames`` and empties into a turn; the conversation keeps at
most ``max_conversation_images``, dropping the oldest images (their turns keep their text)."""

from __future__ import annotations

from rtserve.sessions.conversation import Conversation, ConversationItem
from rtserve.sessions.video_frames import FrameWindow


def test_the_window_keeps_the_newest_frames_and_a_turn_takes_them_all() -> None:
    window = FrameWindow(3)
    for n in range(5):
        window.add(f"frame-{n}")
    assert len(window) == 3
    assert window.take() == ("frame-2", "frame-3", "frame-4")
    assert window.take() == () and len(window) == 0


def test_the_conversation_drops_its_oldest_images_beyond_its_bound() -> None:
    conversation = Conversation(max_items=10, max_bytes=10_000, max_images=4)
    first = ConversationItem("item_1", "user", "text", text="what is this")
    second = ConversationItem("item_2", "user", "text", text="and now")
    conversation.add(first)
    conversation.show(first, ("a", "b", "c"))
    conversation.add(second)
    conversation.show(second, ("d", "e"))
    assert (first.images, second.images) == (("b", "c"), ("d", "e"))
    conversation.show(second, ("f", "g", "h", "i", "j"))
    assert first.images == () and second.images == ("g", "h", "i", "j")
    history = conversation.history()
    assert [(m.content, m.images) for m in history] == [("what is this", ()), ("and now", ("g", "h", "i", "j"))]


def test_an_image_only_turn_enters_history() -> None:
    conversation = Conversation(max_items=10, max_bytes=10_000)
    item = ConversationItem("item_1", "user", "audio", text="")
    conversation.add(item)
    conversation.show(item, ("a",))
    assert [(m.role, m.content, m.images) for m in conversation.history()] == [("user", "", ("a",))]
