"""HTTP generation routes: chat completions, speech, transcriptions (OpenAI shapes)."""

from rtserve.web.http.routes import setup

__all__ = ["setup"]
