"""Copies of a model's modules on the same weights: a second batch of rows
(``sharing_weights``), or a view of the first rows of this batch's streaming state
(``first_rows``), so a step computes only the rows in use (docs/engines.md#row-buckets).

A streaming module (a transformer's rings and positions, a streaming convolution's carried
samples) takes part in ``first_rows`` through ``narrow_rows``: called on the copy only, it points
the copy's state at the first ``rows`` rows of the original's. They are views: what a step of
the copy writes in place, the original holds, so one model steps through either. A module that
lists some of its submodules beside ``_modules`` (Mimi) lists the copy's own (``Relinks``).
"""

from __future__ import annotations

import copy
from typing import Protocol, TypeVar, runtime_checkable

from torch import nn

_M = TypeVar("_M", bound=nn.Module)


@runtime_checkable
class RowState(Protocol):
    def narrow_rows(self, rows: int) -> None:
        """This copy's streaming state becomes the first ``rows`` rows of what it shares."""


@runtime_checkable
class Relinks(Protocol):
    def relink(self) -> None:
        """A copy's own references to its submodules (lists kept beside ``_modules``), made anew
        once its submodules are copies too."""


def buckets(total: int, bucket: int) -> list[int]:
    """What a step may compute of ``total`` (rows, or ring slots attention reads), each size one
    graph: the multiples of ``bucket`` below it, then all of it (0: all of it only)."""
    return [*range(bucket, total, bucket), total] if bucket > 0 else [total]


def sharing_weights(module: _M) -> _M:
    """A copy of ``module`` that shares its parameters and buffers (no new memory) and holds its
    own streaming state from its next ``start``: a second batch of rows on the same weights."""
    clone = copy.copy(module)
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    clone._modules = {
        name: None if child is None else sharing_weights(child) for name, child in module._modules.items()
    }
    if isinstance(clone, Relinks):
        clone.relink()
    return clone


def first_rows(module: _M, rows: int) -> _M:
    """A copy of ``module`` on the same weights whose streaming state is the first ``rows`` rows
    of ``module``'s (started), as views."""
    view = sharing_weights(module)
    for part in view.modules():
        if isinstance(part, RowState):
            part.narrow_rows(rows)
    return view
