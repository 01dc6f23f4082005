"""The image routes: ``POST /v1/images/generations``, ``POST /v1/images/edits`` and the files
``response_format=url`` points at (docs/serving.md#images)."""

from rtserve.web.images.routes import setup

__all__ = ["setup"]
