"""One validated configuration: YAML file, then ``RTSERVE_*`` environment, then CLI flags.

Every limit the server enforces lives here so operators can change it without code.
Nested fields are addressed in the environment with ``__``:
``RTSERVE_SESSIONS__MAX_SESSIONS=64``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

ENV_PREFIX = "RTSERVE_"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SessionLimits(_Section):
    """Per-session and per-server limits of the session core (spec duplex.md §3, §5, U.2)."""

    max_sessions: int = Field(64, ge=1, description="live sessions admitted at once; beyond -> resource_exhausted")
    idle_ttl_s: float | None = Field(300.0, gt=0, description="expire a session idle this long; null disables")
    disconnect_grace_s: float = Field(30.0, ge=0, description="keep a detached session resumable this long")
    reaper_interval_s: float = Field(5.0, gt=0)
    resume_replay_ttl_s: float = Field(60.0, ge=0, description="how long journal entries stay replayable")
    resume_replay_max_bytes_per_session: int = Field(8 * 1024 * 1024, ge=0)
    max_pending_input_bytes_per_session: int = Field(16 * 1024 * 1024, ge=1)
    max_pending_turns_per_session: int = Field(4, ge=1)
    max_pending_output_bytes_per_session: int = Field(2 * 1024 * 1024, ge=1)
    max_pending_output_events_per_session: int = Field(512, ge=1)
    output_reserve_bytes: int = Field(64 * 1024, ge=0, description="extra budget for errors and response endings")
    output_reserve_events: int = Field(8, ge=0)
    close_details_max_bytes: int = Field(4 * 1024, ge=256)
    completed_append_cache_size: int = Field(256, ge=0)
    heartbeat_interval_s: float = Field(15.0, gt=0)
    shutdown_timeout_s: float = Field(10.0, gt=0, description="bound on the graceful drain at SIGTERM")


class TransportLimits(_Section):
    """Wire-level limits shared by every WebSocket and HTTP route."""

    max_ws_message_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    max_http_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    ws_heartbeat_s: float = Field(20.0, gt=0, description="WebSocket ping interval")
    max_concurrent_http_generations: int = Field(8, ge=1, description="beyond -> 429, never an unbounded queue")
    ws_send_queue_events: int = Field(256, ge=1, description="per-connection outbound queue before a slow reader is closed")


class LockstepConfig(_Section):
    """The lockstep frame scheduler (engine.md §8.1, §8.7)."""

    batch_size: int = Field(64, ge=1, description="slots = sessions stepped together")
    max_input_backlog_frames: int = Field(4, ge=1, description="drop-oldest beyond this many queued frames")
    output_queue_frames: int = Field(64, ge=1, description="per-slot hand-off to the event loop")


class RobotConfig(_Section):
    """Robot policy route (serving.md §4.5)."""

    policy: str = Field("demo", description="'demo', 'module:factory', or a path to a TorchScript file")
    max_message_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    idle_timeout_s: float = Field(30.0, gt=0)
    batch_window_ms: float = Field(2.0, ge=0)
    max_batch: int = Field(32, ge=1)


class ModelPaths(_Section):
    """Where the embedded-default models live. ``None`` resolves to the shipped wheel."""

    vad: str | None = None
    asr: str | None = None
    llm: str | None = None
    tts: str | None = None
    cache_dir: str = Field(str(Path.home() / ".cache" / "rtserve"), description="converted model folders")
    cpu_threads: int = Field(2, ge=1, description="bound on intra-op threads per model")
    voice_prompt_dir: str | None = Field(None, description="directory that voice_prompt names resolve inside")


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8091, ge=0, le=65535)
    engine: str = Field("cascade", description="engine serving realtime sessions: cascade, loopback, tone, ...")
    api_key: str | None = Field(None, description="when set, every route requires it")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    sessions: SessionLimits = SessionLimits()
    transport: TransportLimits = TransportLimits()
    lockstep: LockstepConfig = LockstepConfig()
    robot: RobotConfig = RobotConfig()
    models: ModelPaths = ModelPaths()


class ConfigError(Exception):
    """An invalid configuration; ``str()`` is one readable line naming the field."""


def _env_overrides(environ: dict[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        path = key[len(ENV_PREFIX):].lower().split("__")
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        # YAML scalars give ints, floats, bools and null the same way the file does.
        node[path[-1]] = yaml.safe_load(value) if value != "" else None
    return tree


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _first_error_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or "<root>"
    return f"invalid config field '{field}': {err['msg']} (got {err.get('input')!r})"


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> ServerConfig:
    """Build the config; later sources win: file < environment < ``overrides`` (flags)."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}".splitlines()[0]) from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        data = loaded
    data = _merge(data, _env_overrides(dict(os.environ if environ is None else environ)))
    data = _merge(data, {k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return ServerConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_first_error_line(exc)) from None
