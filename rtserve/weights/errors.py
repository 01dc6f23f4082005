"""The one error of weight resolution."""

from __future__ import annotations

from rtserve.config import ConfigError


class WeightsError(ConfigError):
    """Weights that cannot be found or fetched: one line that names the repo, file, variable or
    path at fault. A config error: the server exits 2 instead of restarting into the same failure."""
