"""One torch model build at a time in a process (docs/engines.md#one-model-build-at-a-time).

torch's default dtype is process-wide, and transformers and diffusers make the dtype they load in
the default while they build a model, putting back what they found afterwards. Two such builds at
once (the image and video engines of one front-end) can leave a reduced dtype as the default for
good, and a model built beside one makes the tensors its checkpoint does not hold in that dtype. So
every load that builds torch modules holds ``MODEL_BUILDS`` while it builds: the loads of one
process build one after another (their files are read outside it where the loader allows).
"""

from __future__ import annotations

import threading

MODEL_BUILDS = threading.RLock()  # re-entrant: a build may load a part that is a build of its own
