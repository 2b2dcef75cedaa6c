"""Is LPC configured for this engine, and with what: the opt-in rule of the vLLM plugin.

Installing the package changes nothing: vLLM loads every installed general plugin when
`VLLM_PLUGINS` is unset, and the plugin patches nothing when loaded. LPC runs where an
operator names the LPC scheduler class in vLLM's own configuration (`--scheduler-cls`), which
reads the `lpc` table of `--additional-config '{"lpc": {...}}'`, else the `LPC_*` environment
(`LPC_CONFIG` or any `LPC_*` setting, `config.load_config`). A table in `additional_config` is
validated like the environment, and a bad field stops the engine with a message naming
`additional_config['lpc'].<field>`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from lpc.integrations.config import (
    CONFIG_FILE_VARIABLE,
    ENVIRONMENT_VARIABLES,
    PluginConfig,
    PluginConfigError,
)

ADDITIONAL_CONFIG_KEY = "lpc"
WHERE = f"additional_config[{ADDITIONAL_CONFIG_KEY!r}]"


def configured_by_environment(environ: Mapping[str, str]) -> bool:
    """True when the environment configures LPC: `LPC_CONFIG` or any `LPC_*` setting is set."""
    return bool(environ.get(CONFIG_FILE_VARIABLE)) or any(
        variable in environ for variable in ENVIRONMENT_VARIABLES
    )


def lpc_table(vllm_config: Any) -> Mapping[str, Any] | None:
    """The `lpc` table of the engine's `additional_config` (None: LPC is not configured there).
    Anything but a table under the key is a configuration error, not "off"."""
    additional = getattr(vllm_config, "additional_config", None)
    if not isinstance(additional, Mapping) or ADDITIONAL_CONFIG_KEY not in additional:
        return None
    table = additional[ADDITIONAL_CONFIG_KEY]
    if not isinstance(table, Mapping):
        raise PluginConfigError(
            f"{WHERE} must be a table of LPC settings, got {type(table).__name__} {table!r}"
        )
    return table


def config_from_table(table: Mapping[str, Any]) -> PluginConfig:
    """The plugin's configuration from an `additional_config` table, validated: an unknown key
    or a bad value raises `PluginConfigError` naming `additional_config['lpc'].<field>`."""
    known = [f.name for f in fields(PluginConfig)]
    unknown = sorted(str(key) for key in table if key not in known)
    if unknown:
        raise PluginConfigError(
            f"{WHERE}: unknown setting(s) {', '.join(map(repr, unknown))}; known: "
            f"{', '.join(known)}"
        )
    for key, value in table.items():
        try:
            PluginConfig(**{key: value})
        except PluginConfigError as error:
            raise PluginConfigError(f"{WHERE}.{error}") from None
    return PluginConfig(**dict(table))
