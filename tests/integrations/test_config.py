"""Plugin configuration: environment, files, precedence, and errors that name the culprit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lpc.integrations.config import (
    ENVIRONMENT_VARIABLES,
    PluginConfig,
    PluginConfigError,
    load_config,
)


def test_defaults_without_any_setting() -> None:
    config = load_config({})
    assert config == PluginConfig()
    assert config.predictor_url is None and config.fallback_probability == 0.5


def test_every_field_has_a_variable() -> None:
    assert sorted(ENVIRONMENT_VARIABLES.values()) == sorted(PluginConfig().as_dict())


def test_environment_variables_set_fields() -> None:
    config = load_config(
        {
            "LPC_SCALE": "0.02",
            "LPC_FALLBACK_P": "0.3",
            "LPC_PREDICTOR_URL": "http://127.0.0.1:8100",
            "LPC_PREDICTOR_TIMEOUT_S": "0.25",
            "LPC_PREDICTOR_TOKEN": "secret",
            "LPC_MAX_PENDING_PREDICTIONS": "10",
            "LPC_METRICS_PORT": "9109",
            "LPC_STATS_LOG_INTERVAL_S": "0",
            "LPC_EVICTOR": "lpc",  # not the default (lpc-pooled)
            "LPC_POOLED_MEMORY": "blocks",  # not the default (content)
        }
    )
    assert config.evictor == "lpc" and config.pooled_memory == "blocks"
    assert config.scale_per_s == 0.02 and config.fallback_probability == 0.3
    assert config.predictor_url == "http://127.0.0.1:8100" and config.predictor_timeout_s == 0.25
    assert config.max_pending_predictions == 10 and config.metrics_port == 9109
    assert config.stats_log_interval_s == 0.0
    assert config.as_dict()["predictor_token"] == "***", "the token must not reach logs"


@pytest.mark.parametrize(
    ("variable", "value", "fragment"),
    [
        ("LPC_FALLBACK_P", "1.5", "must be in [0, 1]"),
        ("LPC_FALLBACK_P", "nan", "finite"),
        ("LPC_SCALE", "fast", "not a valid value for scale_per_s"),
        ("LPC_SCALE", "-1", "must be >= 0"),
        ("LPC_PROBABILITY_FLOOR", "0.5", "(0, 0.5)"),
        ("LPC_PREDICTOR_URL", "127.0.0.1:8100", "http:// or https://"),
        ("LPC_PREDICTOR_TIMEOUT_S", "0", "must be in (0, 86400] seconds"),
        # issue 44 case 7: accepted, then the kill switch's watcher thread died (OverflowError)
        ("LPC_CONTROL_POLL_S", "1e10", "control_poll_s must be in (0, 86400] seconds"),
        ("LPC_CONTROL_POLL_S", "0", "control_poll_s must be in (0, 86400] seconds"),
        ("LPC_CONTROL_POLL_S", "inf", "finite"),
        ("LPC_PREDICTOR_TIMEOUT_S", "1e10", "predictor_timeout_s must be in (0, 86400]"),
        ("LPC_STATS_LOG_INTERVAL_S", "1e10", "must be 0 (never) or in (0, 86400]"),
        ("LPC_ACCESS_MODEL_RELOAD_S", "1e10", "must be 0 (never) or in (0, 86400]"),
        ("LPC_RETURN_MODEL_RELOAD_S", "-1", "must be 0 (never) or in (0, 86400]"),
        # issue 44 case 12: raised httpx.InvalidURL at the first request, naming no variable
        ("LPC_PREDICTOR_URL", "http://127.0.0.1:notaport", "predictor_url is not a valid URL"),
        ("LPC_PREDICTOR_URL", "http://127.0.0.1:99999", "predictor_url is not a valid URL"),
        ("LPC_PREDICTOR_URL", "http://:8100", "predictor_url has no host"),
        ("LPC_PREDICTOR_URL", "http://127.0.0.1:0", "port must be in [1, 65535]"),
        ("LPC_MAX_PENDING_PREDICTIONS", "0", "integer >= 1"),
        ("LPC_MAX_PENDING_PREDICTIONS", "2.5", "not a valid value"),
        ("LPC_METRICS_PORT", "70000", "[1, 65535]"),
        ("LPC_EVICTOR", "lru", "one of lpc, lpc-pooled"),
        ("LPC_POOLED_MEMORY", "hash", "must be one of content, blocks"),
    ],
)
def test_bad_variables_name_the_variable_and_value(
    variable: str, value: str, fragment: str
) -> None:
    with pytest.raises(PluginConfigError) as error:
        load_config({variable: value})
    message = str(error.value)
    assert variable in message and repr(value) in message and fragment in message


def test_a_bad_timer_in_a_file_names_the_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "lpc.toml"
    path.write_text("control_poll_s = 1e10\n")
    with pytest.raises(
        PluginConfigError, match=r"lpc\.toml: control_poll_s must be in \(0, 86400\]"
    ):
        load_config({"LPC_CONFIG": str(path)})
    path.write_text('predictor_url = "http://127.0.0.1:notaport"\n')
    with pytest.raises(PluginConfigError, match=r"lpc\.toml: predictor_url is not a valid URL"):
        load_config({"LPC_CONFIG": str(path)})


def test_the_longest_timers_and_a_url_with_a_path_are_accepted() -> None:
    config = load_config(
        {
            "LPC_CONTROL_POLL_S": "86400",
            "LPC_STATS_LOG_INTERVAL_S": "0",
            "LPC_PREDICTOR_URL": "https://predictor.internal:8443/lpc/",
        }
    )
    assert config.control_poll_s == 86400.0 and config.stats_log_interval_s == 0.0
    assert config.predictor_url == "https://predictor.internal:8443/lpc/"


def test_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "lpc.toml"
    path.write_text(
        'fallback_probability = 0.2\nscale_per_s = 0.005\npredictor_url = "http://h:1"\n'
    )
    config = load_config({"LPC_CONFIG": str(path)})
    assert (config.fallback_probability, config.scale_per_s) == (0.2, 0.005)
    assert config.predictor_url == "http://h:1"


def test_json_file_and_lpc_table(tmp_path: Path) -> None:
    path = tmp_path / "lpc.json"
    path.write_text(json.dumps({"lpc": {"fallback_probability": 0.9, "metrics_port": 9000}}))
    config = load_config({"LPC_CONFIG": str(path)})
    assert config.fallback_probability == 0.9 and config.metrics_port == 9000


def test_variables_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "lpc.toml"
    path.write_text("fallback_probability = 0.2\n")
    config = load_config({"LPC_CONFIG": str(path), "LPC_FALLBACK_P": "0.7"})
    assert config.fallback_probability == 0.7


def test_file_errors_name_the_file_and_key(tmp_path: Path) -> None:
    bad_value = tmp_path / "bad.toml"
    bad_value.write_text("fallback_probability = 2\n")
    with pytest.raises(PluginConfigError, match=r"bad\.toml: fallback_probability must be in"):
        load_config({"LPC_CONFIG": str(bad_value)})
    unknown = tmp_path / "typo.toml"
    unknown.write_text("fallback_p = 0.2\n")
    with pytest.raises(PluginConfigError, match=r"unknown setting\(s\) 'fallback_p'; known: "):
        load_config({"LPC_CONFIG": str(unknown)})
    with pytest.raises(PluginConfigError, match="no such file"):
        load_config({"LPC_CONFIG": str(tmp_path / "missing.toml")})
    yaml = tmp_path / "lpc.yaml"
    yaml.write_text("x: 1\n")
    with pytest.raises(PluginConfigError, match=r"use a \.toml or \.json file"):
        load_config({"LPC_CONFIG": str(yaml)})
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(PluginConfigError, match="cannot parse"):
        load_config({"LPC_CONFIG": str(broken)})


def test_typed_values_in_files_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "lpc.json"
    path.write_text(json.dumps({"metrics_port": 9000.5}))
    with pytest.raises(PluginConfigError, match="metrics_port must be a port number"):
        load_config({"LPC_CONFIG": str(path)})
    path.write_text(json.dumps({"fallback_probability": True}))
    with pytest.raises(PluginConfigError, match="fallback_probability must be a finite number"):
        load_config({"LPC_CONFIG": str(path)})
