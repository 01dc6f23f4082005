"""Images kept for ``response_format=url``: bounded in count and time, in memory (nothing is
written to disk), the oldest dropped first (docs/serving.md#images)."""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass

from rtserve.clock import Clock, SystemClock


@dataclass(frozen=True)
class StoredImage:
    data: bytes
    content_type: str
    expires_at: float


class ImageStore:
    def __init__(self, max_images: int, ttl_s: float, clock: Clock | None = None) -> None:
        self._max = max_images
        self._ttl_s = ttl_s
        self._clock = clock or SystemClock()
        self._images: OrderedDict[str, StoredImage] = OrderedDict()

    def put(self, data: bytes, content_type: str, extension: str) -> str:
        """Keep ``data``; its file name (unguessable: the name is the only key to it)."""
        self._expire()
        name = f"{secrets.token_urlsafe(24)}.{extension}"
        self._images[name] = StoredImage(data, content_type, self._clock.monotonic() + self._ttl_s)
        while len(self._images) > self._max:
            self._images.popitem(last=False)
        return name

    def get(self, name: str) -> StoredImage | None:
        self._expire()
        return self._images.get(name)

    def _expire(self) -> None:
        now = self._clock.monotonic()
        while self._images and next(iter(self._images.values())).expires_at <= now:
            self._images.popitem(last=False)
