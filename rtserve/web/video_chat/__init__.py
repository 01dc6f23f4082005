"""``WS /v1/video/chat/stream``: camera frames in, the agent's text and speech out (docs/video.md#video-chat-stream)."""

from rtserve.web.video_chat.routes import setup

__all__ = ["setup"]
