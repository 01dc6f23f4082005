"""rtserve: a realtime streaming media server for speech and robot models."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rtserve")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
