from __future__ import annotations

import pytest

from rtserve.config import ConfigError, load_config


def test_defaults_match_the_spec_limits():
    cfg = load_config(environ={})
    assert cfg.port == 8091 and cfg.host == "127.0.0.1"
    s = cfg.sessions
    assert s.max_pending_output_bytes_per_session == 2 * 1024 * 1024
    assert s.max_pending_output_events_per_session == 512
    assert (s.output_reserve_bytes, s.output_reserve_events) == (64 * 1024, 8)
    assert s.close_details_max_bytes == 4096
    assert (s.idle_ttl_s, s.disconnect_grace_s, s.reaper_interval_s) == (300.0, 30.0, 5.0)
    assert s.max_pending_input_bytes_per_session == 16 * 1024 * 1024
    assert s.max_pending_turns_per_session == 4
    assert cfg.robot.max_message_bytes == 64 * 1024 * 1024
    assert cfg.robot.idle_timeout_s == 30.0


def test_file_then_env_then_flags(tmp_path):
    path = tmp_path / "rt.yaml"
    path.write_text("port: 9000\nengine: tone\nsessions:\n  max_sessions: 3\n  idle_ttl_s: 10\n")
    env = {"RTSERVE_SESSIONS__MAX_SESSIONS": "7", "RTSERVE_ENGINE": "loopback", "HOME_UNRELATED": "x"}
    cfg = load_config(path, overrides={"engine": "cascade", "port": None}, environ=env)
    assert cfg.port == 9000  # file value kept: a flag left unset does not override
    assert cfg.sessions.max_sessions == 7  # env beats file
    assert cfg.sessions.idle_ttl_s == 10.0  # untouched file value
    assert cfg.engine == "cascade"  # flag beats env


def test_env_null_disables_idle_expiry():
    cfg = load_config(environ={"RTSERVE_SESSIONS__IDLE_TTL_S": "null"})
    assert cfg.sessions.idle_ttl_s is None


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("sessions:\n  max_sessions: 0\n", "sessions.max_sessions"),
        ("port: 70000\n", "port"),
        ("sessions:\n  max_sesions: 3\n", "sessions.max_sesions"),
        ("transport:\n  ws_heartbeat_s: fast\n", "transport.ws_heartbeat_s"),
        ("moshi_engine:\n  kv_block_frames: 48\n", "moshi_engine.kv_block_frames"),
        ("moshi_engine:\n  kv_cache: fp8\n", "moshi_engine.kv_cache"),
        ("tts_engine:\n  young_burst_ms: 80\n", "tts_engine.young_burst_ms"),  # older replies ran dry
    ],
)
def test_invalid_config_names_the_field_in_one_line(tmp_path, text, field):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    message = str(info.value)
    assert f"'{field}'" in message
    assert "\n" not in message


def test_a_rule_across_fields_names_them_in_one_line_without_echoing_the_config():
    """A heartbeat whose pong timeout is shorter than the reply audio a paced reader has queued
    ahead of the ping would drop healthy clients mid-answer; the input (a secret among it) stays out."""
    overrides = {"engine": "cascade", "transport": {"ws_heartbeat_s": 12}, "api_key": "s3cr3t-value"}
    with pytest.raises(ConfigError) as info:
        load_config(environ={}, overrides=overrides)
    message = str(info.value)
    assert "transport.ws_heartbeat_s (12 s)" in message and "cascade.max_audio_ahead_s (8 s)" in message
    assert "s3cr3t-value" not in message and "\n" not in message
    overrides["cascade"] = {"max_audio_ahead_s": 4}  # less audio ahead: the same heartbeat holds
    assert load_config(environ={}, overrides=overrides).transport.ws_heartbeat_s == 12


def test_unreadable_or_non_mapping_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml", environ={})
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(path, environ={})
