"""The serving plugin's configuration: environment variables or a TOML/JSON file, validated.

A plugin is loaded by the engine, not called by the operator, so its settings come from the
process environment: `LPC_CONFIG=/path/to/lpc.toml` (or `.json`) names a file, and `LPC_*`
variables override single fields of it. Everything is validated when the plugin loads, and a
bad value stops the engine with a message naming the variable (or file and key) and the value,
instead of surfacing later as odd eviction.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from eviction import POLICIES, policy_names
from eviction.lpc import (
    DEFAULT_FALLBACK_PROBABILITY,
    DEFAULT_PROBABILITY_FLOOR,
    DEFAULT_SCALE_PER_S,
)
from eviction.lpc_pooled import DEFAULT_MEMORY, MEMORIES
from lpc.integrations.engine_checks import ALLOW_VARIABLE, parse_allowed
from lpc.integrations.kill_switch import DEFAULT_MODE, check_mode
from predictor.client import check_predictor_url

CONFIG_FILE_VARIABLE = "LPC_CONFIG"


class PluginConfigError(ValueError):
    """A setting that cannot be used; the message names where it came from and its value."""


@dataclass(frozen=True)
class PluginConfig:
    """Everything the serving plugin can be told.

    `evictor` names the learned evictor the free-block queue drives: `lpc-pooled` (the
    default: OR pooling and an online floor for prefixes shared across conversations, and a
    trust gate that keys releases at the fallback p, i.e. LRU's order, until the model has
    done at least as well as a constant on the labels seen so far; `eviction/lpc_pooled.py`;
    vLLM only), plain `lpc`, or `lpc-return` (P(the conversation returns within the cache's
    own holding time | silent so far), from the return-time model `return_model`;
    `eviction/return_window.py`; vLLM only). `pooled_memory` is where `lpc-pooled` keeps
    what it knows of sharing: `chains` (the default: each block's own metadata and, per
    release, one entry under its top block's hash, across evictions; docs/results.md,
    "`lpc-pooled`'s sharing memory kept by chain"), `content` (a hash memory of each
    content's last release, one entry per block) or `blocks` (each block's own metadata
    alone, at a measured cost in hits: "... kept by block"). Its horizon comes from the
    access model's artifact when one is loaded (`access_model`), else 180 s. `scale_per_s`,
    `fallback_probability` and `probability_floor` are the LPC evictors'. The
    predictor fields say where asynchronous predictions come from (None: only probabilities
    carried by requests, else the fallback). `max_pending_predictions` bounds the predictions
    in flight or waiting to be consumed, so a slow predictor cannot grow memory without bound.
    `stats_log_interval_s` spaces the plugin's counter log lines (0: never). `metrics_port`
    serves the counters in Prometheus text format on `metrics_host` (None: no server; a
    data-parallel rank r serves on `metrics_port` + r).
    `request_log_dir` turns on the request log (`request_log`: one `lpc` trace line per
    finished request, for replays and retraining): daily files per process, rotated at
    `request_log_max_file_mb`; prompt text only with `request_log_text`; block ids keyed by
    `request_log_salt` (None: a random key kept in the folder); at most
    `request_log_queue_size` records waiting (more are dropped and counted, never waited for);
    files of days more than `request_log_retention_days` UTC days old are deleted (0: kept).
    `access_model` is an access-only artifact folder (or a registry folder, whose `current`
    is followed) the plugin predicts with in process at each release; a background thread
    looks for a newly promoted one every `access_model_reload_s` (0: never). The conversation table
    that feeds it holds at most `conversation_table_size` conversations and
    `conversation_table_max_tokens` previous-request tokens (least recently updated evicted
    first) and forgets a conversation idle longer than `conversation_expiry_s`.
    `return_model` is a return-time artifact folder (`lpc train-return`, or a registry folder
    such as the daily job's `<registry>-return`, whose `current` is followed): the plugin
    computes each finished release's return curve in process from the same features, for the
    `lpc-return` evictor (which needs it) and the CPU tier's `LPCReturnCachePolicy`; a
    background thread looks for a newly promoted one every `return_model_reload_s` (0: never).
    `mode` is what the engine starts in: `lpc` (the learned order), `lru` (stock vLLM's order,
    exactly: the kill switch) or `shadow` (stock vLLM's order, while metadata-only LPC and LRU
    caches of the engine's size replay the same requests and export their hit ratios).
    `control_file`, when set, is a file holding one of those words, read every
    `control_poll_s` seconds by a background thread: writing it switches the running engine.
    Every interval and timeout above is at most `MAX_TIMER_S` (a day; 0 means never where
    the field says so), and `predictor_url` must parse as an http(s) URL with a host and a
    numeric port, so a typo stops the engine at load instead of killing a thread later.
    `allow_unverified` names engine configurations the plugin is not verified with that it
    may run in anyway (`engine_checks`: `kv-groups`, `speculative-decoding`; empty: refuse
    them when the engine starts).
    The trust boundary (`trust`): a probability in a request's body (`lpc_probability`, e.g.
    vLLM's `vllm_xargs`) is ignored unless `trust_request_hints` (every client is trusted:
    only behind a router that sets or strips the field) or it carries `lpc_signature`, an
    HMAC-SHA256 under `hint_key` (the router's key) over the probability, conversation and
    tenant. Hints in vLLM's orchestrator channel (`Request.kv_hints`) are trusted. Conversation
    ids, from the body or vLLM's `session_id`, are always namespaced by the request's tenant
    (`cache_salt`, LoRA adapter).
    `pinned_share` caps one tenant's pinned share of the pool: at most that fraction of the
    free queue's blocks may be held by one tenant's releases whose trusted hint put their p
    above `fallback_probability` (above LRU's place); a release that would pass it is keyed
    at the fallback p instead (`pinned_share_capped`), once a second tenant has released into
    the pool (a lone tenant displaces only its own blocks). The default 0.5 follows the rule
    that no single tenant may hold a majority of the pool above LRU's place while another
    tenant shares it; 1.0 is no cap.
    """

    evictor: str = "lpc-pooled"
    pooled_memory: str = DEFAULT_MEMORY
    scale_per_s: float = DEFAULT_SCALE_PER_S
    fallback_probability: float = DEFAULT_FALLBACK_PROBABILITY
    probability_floor: float = DEFAULT_PROBABILITY_FLOOR
    predictor_url: str | None = None
    predictor_timeout_s: float = 0.5
    predictor_token: str | None = None
    max_pending_predictions: int = 4096
    max_prediction_batch: int = 64
    stats_log_interval_s: float = 60.0
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    request_log_dir: str | None = None
    request_log_max_file_mb: float = 256.0
    request_log_text: bool = False
    request_log_salt: str | None = None
    request_log_queue_size: int = 65536
    request_log_retention_days: int = 30
    access_model: str | None = None
    access_model_reload_s: float = 60.0
    conversation_table_size: int = 100_000
    conversation_expiry_s: float = 3600.0
    conversation_table_max_tokens: int = 50_000_000
    return_model: str | None = None
    return_model_reload_s: float = 60.0
    mode: str = DEFAULT_MODE
    control_file: str | None = None
    control_poll_s: float = 1.0
    allow_unverified: str = ""
    trust_request_hints: bool = False
    hint_key: str | None = None
    pinned_share: float = 0.5

    def __post_init__(self) -> None:
        for spec in _FIELDS.values():
            spec.check(spec.name, getattr(self, spec.name))

    def as_dict(self) -> dict[str, Any]:
        """The settings, with the predictor token masked (for logs and `stats_snapshot()`)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for secret in ("predictor_token", "request_log_salt", "hint_key"):
            if out[secret]:
                out[secret] = "***"
        return out


# -- field parsing and validation ------------------------------------------------------------
def _finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PluginConfigError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _check_evictor(name: str, value: Any) -> None:
    if value not in POLICIES or POLICIES[value].kind != "learned":
        known = ", ".join(policy_names("learned"))
        raise PluginConfigError(f"{name} must be one of {known}, got {value!r}")


def _check_pooled_memory(name: str, value: Any) -> None:
    if value not in MEMORIES:
        raise PluginConfigError(f"{name} must be one of {', '.join(MEMORIES)}, got {value!r}")


def _check_mode(name: str, value: Any) -> None:
    if not isinstance(value, str) or value != value.strip().lower():
        raise PluginConfigError(f"{name} must be one of lpc, lru, shadow, got {value!r}")
    try:
        check_mode(value, name)
    except ValueError as error:
        raise PluginConfigError(str(error)) from None


def _check_scale(name: str, value: Any) -> None:
    if _finite(name, value) < 0:
        raise PluginConfigError(f"{name} must be >= 0, got {value!r}")


def _check_probability(name: str, value: Any) -> None:
    if not 0.0 <= _finite(name, value) <= 1.0:
        raise PluginConfigError(f"{name} must be in [0, 1], got {value!r}")


def _check_floor(name: str, value: Any) -> None:
    if not 0.0 < _finite(name, value) < 0.5:
        raise PluginConfigError(f"{name} must be in (0, 0.5), got {value!r}")


def _check_positive(name: str, value: Any) -> None:
    if not _finite(name, value) > 0:
        raise PluginConfigError(f"{name} must be > 0, got {value!r}")


# Every setting that ends up in a timer (a poll, a reload check, a timeout, a log interval)
# is at most a day: a longer one is a typo, and past threading's limit (about 292 years) it
# would kill the thread that waits on it (`LPC_CONTROL_POLL_S=1e10` did: the kill switch
# stopped listening).
MAX_TIMER_S = 86_400.0


def _check_timer(name: str, value: Any) -> None:
    if not 0 < _finite(name, value) <= MAX_TIMER_S:
        raise PluginConfigError(f"{name} must be in (0, {MAX_TIMER_S:g}] seconds, got {value!r}")


def _check_optional_timer(name: str, value: Any) -> None:
    if not 0 <= _finite(name, value) <= MAX_TIMER_S:
        raise PluginConfigError(
            f"{name} must be 0 (never) or in (0, {MAX_TIMER_S:g}] seconds, got {value!r}"
        )


def _check_count(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PluginConfigError(f"{name} must be an integer >= 1, got {value!r}")


def _check_url(name: str, value: Any) -> None:
    if value is None:
        return
    try:
        check_predictor_url(value)
    except ValueError as error:
        raise PluginConfigError(f"{name} {error}") from None


def _check_optional_str(name: str, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise PluginConfigError(f"{name} must be a non-empty string, got {value!r}")


def _check_days(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 3650:
        raise PluginConfigError(
            f"{name} must be a whole number of days in [0, 3650], got {value!r}"
        )


def _check_port(name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise PluginConfigError(f"{name} must be a port number in [1, 65535], got {value!r}")


def _check_host(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise PluginConfigError(f"{name} must be a host name or address, got {value!r}")


def _check_unverified(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise PluginConfigError(f"{name} must be a comma-separated string, got {value!r}")
    try:
        parse_allowed(value)
    except ValueError as error:
        raise PluginConfigError(f"{name}={value!r}: {error}") from None


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise PluginConfigError(f"{name} must be true or false, got {value!r}")


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(text)


def _parse_float(text: str) -> float:
    return float(text)


def _parse_int(text: str) -> int:
    return int(text)


def _parse_optional_int(text: str) -> int | None:
    return None if text.strip().lower() in ("", "none", "off") else int(text)


def _parse_optional_str(text: str) -> str | None:
    return text or None


@dataclass(frozen=True)
class _FieldSpec:
    name: str
    variable: str  # the environment variable that sets it
    parse: Callable[[str], Any]  # environment text -> value (file values arrive typed)
    check: Callable[[str, Any], None]


_FIELDS: dict[str, _FieldSpec] = {
    spec.name: spec
    for spec in (
        _FieldSpec("evictor", "LPC_EVICTOR", str, _check_evictor),
        _FieldSpec("pooled_memory", "LPC_POOLED_MEMORY", str, _check_pooled_memory),
        _FieldSpec("scale_per_s", "LPC_SCALE", _parse_float, _check_scale),
        _FieldSpec("fallback_probability", "LPC_FALLBACK_P", _parse_float, _check_probability),
        _FieldSpec("probability_floor", "LPC_PROBABILITY_FLOOR", _parse_float, _check_floor),
        _FieldSpec("predictor_url", "LPC_PREDICTOR_URL", _parse_optional_str, _check_url),
        _FieldSpec("predictor_timeout_s", "LPC_PREDICTOR_TIMEOUT_S", _parse_float, _check_timer),
        _FieldSpec(
            "predictor_token", "LPC_PREDICTOR_TOKEN", _parse_optional_str, _check_optional_str
        ),
        _FieldSpec(
            "max_pending_predictions", "LPC_MAX_PENDING_PREDICTIONS", _parse_int, _check_count
        ),
        _FieldSpec("max_prediction_batch", "LPC_MAX_PREDICTION_BATCH", _parse_int, _check_count),
        _FieldSpec(
            "stats_log_interval_s", "LPC_STATS_LOG_INTERVAL_S", _parse_float, _check_optional_timer
        ),
        _FieldSpec("metrics_port", "LPC_METRICS_PORT", _parse_optional_int, _check_port),
        _FieldSpec("metrics_host", "LPC_METRICS_HOST", str, _check_host),
        _FieldSpec(
            "request_log_dir", "LPC_REQUEST_LOG_DIR", _parse_optional_str, _check_optional_str
        ),
        _FieldSpec(
            "request_log_max_file_mb",
            "LPC_REQUEST_LOG_MAX_FILE_MB",
            _parse_float,
            _check_positive,
        ),
        _FieldSpec("request_log_text", "LPC_REQUEST_LOG_TEXT", _parse_bool, _check_bool),
        _FieldSpec(
            "request_log_salt", "LPC_REQUEST_LOG_SALT", _parse_optional_str, _check_optional_str
        ),
        _FieldSpec(
            "request_log_queue_size", "LPC_REQUEST_LOG_QUEUE_SIZE", _parse_int, _check_count
        ),
        _FieldSpec(
            "request_log_retention_days",
            "LPC_REQUEST_LOG_RETENTION_DAYS",
            _parse_int,
            _check_days,
        ),
        _FieldSpec("access_model", "LPC_ACCESS_MODEL", _parse_optional_str, _check_optional_str),
        _FieldSpec(
            "access_model_reload_s",
            "LPC_ACCESS_MODEL_RELOAD_S",
            _parse_float,
            _check_optional_timer,
        ),
        _FieldSpec(
            "conversation_table_size", "LPC_CONVERSATION_TABLE_SIZE", _parse_int, _check_count
        ),
        _FieldSpec(
            "conversation_expiry_s", "LPC_CONVERSATION_EXPIRY_S", _parse_float, _check_positive
        ),
        _FieldSpec(
            "conversation_table_max_tokens",
            "LPC_CONVERSATION_TABLE_MAX_TOKENS",
            _parse_int,
            _check_count,
        ),
        _FieldSpec("return_model", "LPC_RETURN_MODEL", _parse_optional_str, _check_optional_str),
        _FieldSpec(
            "return_model_reload_s",
            "LPC_RETURN_MODEL_RELOAD_S",
            _parse_float,
            _check_optional_timer,
        ),
        _FieldSpec("mode", "LPC_MODE", str.lower, _check_mode),
        _FieldSpec("control_file", "LPC_CONTROL_FILE", _parse_optional_str, _check_optional_str),
        _FieldSpec("control_poll_s", "LPC_CONTROL_POLL_S", _parse_float, _check_timer),
        _FieldSpec("allow_unverified", ALLOW_VARIABLE, str, _check_unverified),
        _FieldSpec("trust_request_hints", "LPC_TRUST_REQUEST_HINTS", _parse_bool, _check_bool),
        _FieldSpec("hint_key", "LPC_HINT_KEY", _parse_optional_str, _check_optional_str),
        _FieldSpec("pinned_share", "LPC_PINNED_SHARE", _parse_float, _check_probability),
    )
}
ENVIRONMENT_VARIABLES: dict[str, str] = {spec.variable: spec.name for spec in _FIELDS.values()}


def _read_file(path: Path) -> dict[str, Any]:
    """The settings in a TOML or JSON file: a flat table keyed by field name."""
    if not path.is_file():
        raise PluginConfigError(f"{CONFIG_FILE_VARIABLE}={path}: no such file")
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            with path.open("rb") as handle:
                data: Any = tomllib.load(handle)
        elif suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
        else:
            raise PluginConfigError(
                f"{CONFIG_FILE_VARIABLE}={path}: use a .toml or .json file, got {suffix!r}"
            )
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PluginConfigError(f"{path}: cannot parse ({error})") from None
    if isinstance(data, dict) and isinstance(data.get("lpc"), dict) and len(data) == 1:
        data = data["lpc"]  # a `[lpc]` table is accepted too
    if not isinstance(data, dict):
        raise PluginConfigError(f"{path}: expected a table of settings, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise PluginConfigError(
            f"{path}: unknown setting(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(_FIELDS)}"
        )
    return data


def load_config(environ: Mapping[str, str] | None = None) -> PluginConfig:
    """Defaults, then the `LPC_CONFIG` file, then `LPC_*` variables; validated at each step."""
    environ = os.environ if environ is None else environ
    config = PluginConfig()
    file_name = environ.get(CONFIG_FILE_VARIABLE)
    if file_name:
        path = Path(file_name)
        values = _read_file(path)
        for key, value in values.items():
            try:
                _FIELDS[key].check(key, value)
            except PluginConfigError as error:
                raise PluginConfigError(f"{path}: {error}") from None
        config = replace(config, **values)
    overrides: dict[str, Any] = {}
    for variable, name in ENVIRONMENT_VARIABLES.items():
        text = environ.get(variable)
        if text is None:
            continue
        spec = _FIELDS[name]
        try:
            value = spec.parse(text.strip())
        except ValueError:
            raise PluginConfigError(f"{variable}={text!r}: not a valid value for {name}") from None
        try:
            spec.check(name, value)
        except PluginConfigError as error:
            raise PluginConfigError(f"{variable}={text!r}: {error}") from None
        overrides[name] = value
    return replace(config, **overrides) if overrides else config
