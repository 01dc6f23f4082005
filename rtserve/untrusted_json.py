"""Parse JSON that came from outside the server, with its nesting bounded.

The standard parser recurses once per level of nesting until the interpreter's recursion
limit, so a body of a hundred thousand brackets fails with a ``RecursionError`` at the very
bottom of the stack. Anything that runs there fails too: a garbage collection that starts
during the parse calls the process's gc callbacks (``rtserve_gc_pause_seconds``) with no
stack to spare, and a value nested just under the limit fails later in whatever walks it
(validation, ``json.dumps`` of an echoed session). Depth is counted first, without recursion
and without Python work per byte, and anything deeper than ``MAX_DEPTH`` is refused as bad
JSON. The bound is not a resource limit (the configurable body sizes are); it keeps every
JSON value in the process far from the recursion limit.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

MAX_DEPTH = 128  # nesting levels: far deeper than any request or tool schema, far under the ~1000 frames Python allows

# A JSON string, its closing quote optional so an unterminated one ends the scan instead of being
# retried from every quote inside it (quadratic on a string of escaped quotes); possessive, as
# nothing inside a string is ever given back (4x faster on a body of escapes).
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"?', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_STEP = np.zeros(256, np.int8)
_DEPTH_STEP[list(b"[{")] = 1
_DEPTH_STEP[list(b"]}")] = -1


class JsonTooDeep(ValueError):
    """JSON nested deeper than the parser takes; a ``ValueError``, as the parser's own errors are."""


def loads(raw: str | bytes | bytearray, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads``, refusing nesting deeper than ``max_depth`` with ``JsonTooDeep``."""
    openings = raw.count("[") + raw.count("{") if isinstance(raw, str) else raw.count(b"[") + raw.count(b"{")
    if openings > max_depth:  # the count bounds the depth and takes no scan: the common case ends here
        depth = nesting_depth(raw)
        if depth > max_depth:
            raise JsonTooDeep(f"JSON nested {depth} levels deep; at most {max_depth} are accepted")
    return json.loads(raw)


def nesting_depth(raw: str | bytes | bytearray) -> int:
    """The deepest nesting of arrays and objects outside strings (of well-formed JSON; a guess for other text)."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    steps = _DEPTH_STEP[np.frombuffer(brackets, np.uint8)]
    return int(np.cumsum(steps, dtype=np.int64).max(initial=0))
