"""HTTP generation routes: chat completions (and vLLM's /tokenize), speech, transcriptions (OpenAI shapes)."""

from rtserve.web.http.routes import setup

__all__ = ["setup"]
