"""Children of the supervisor never outlive it, whatever killed it.

``PR_SET_PDEATHSIG`` makes the kernel SIGKILL the child when the parent dies (even by
SIGKILL, where no handler runs). It fires on the death of the parent *thread* that
forked, which is the supervisor's main thread. The parent may already be gone by the time
the child sets it, so the child checks its parent id once afterwards.
"""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the parent-id check below still runs once
        pass
    if os.getppid() != parent_pid:
        os._exit(1)
