"""The vLLM plugin's opt-in rule (`lpc.integrations.engine_config`), without vLLM.

Installed, the plugin must change nothing until an operator configures it: through vLLM's
`--additional-config '{"lpc": {...}}'` or the `LPC_*` environment. A bad table names the field.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lpc.integrations.config import PluginConfigError
from lpc.integrations.engine_config import (
    config_from_table,
    configured_by_environment,
    lpc_table,
)


def test_only_an_lpc_setting_in_the_environment_configures_it() -> None:
    assert not configured_by_environment({})
    assert not configured_by_environment({"VLLM_PLUGINS": "lpc", "PATH": "/bin"})
    assert not configured_by_environment({"LPC_VLLM_ALLOW_UNTESTED": "1"})  # not a setting
    assert not configured_by_environment({"LPC_CONFIG": ""})
    assert configured_by_environment({"LPC_MODE": "shadow"})
    assert configured_by_environment({"LPC_CONFIG": "/etc/lpc.toml"})


def test_the_table_comes_from_vllm_s_additional_config() -> None:
    assert lpc_table(SimpleNamespace(additional_config={})) is None
    assert lpc_table(SimpleNamespace(additional_config={"other": 1})) is None
    assert lpc_table(SimpleNamespace()) is None  # a config without the field: not configured
    assert lpc_table(SimpleNamespace(additional_config={"lpc": {}})) == {}
    with pytest.raises(PluginConfigError, match=r"additional_config\['lpc'\] must be a table"):
        lpc_table(SimpleNamespace(additional_config={"lpc": "on"}))


def test_a_table_gives_the_validated_configuration() -> None:
    config = config_from_table({"evictor": "lpc", "fallback_probability": 0.3, "mode": "shadow"})
    assert (config.evictor, config.fallback_probability, config.mode) == ("lpc", 0.3, "shadow")
    assert config_from_table({}).evictor == "lpc-pooled"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            {"fallback_probability": 1.5},
            r"additional_config\['lpc'\]\.fallback_probability must be in \[0, 1\], got 1\.5",
        ),
        ({"mode": "fast"}, r"additional_config\['lpc'\]\.mode must be one of"),
        ({"metrics_port": "9000"}, r"additional_config\['lpc'\]\.metrics_port must be a port"),
        ({"fallback_p": 0.5}, r"additional_config\['lpc'\]: unknown setting\(s\) 'fallback_p'"),
    ],
)
def test_a_bad_table_names_the_field_and_value(table: dict, message: str) -> None:
    with pytest.raises(PluginConfigError, match=message):
        config_from_table(table)
