"""Engine configurations the plugin is not verified with, refused when the engine starts.

Several KV cache groups (hybrid models) and speculative decoding change what reaches the free
queue in ways no test covers, so the LPC scheduler class refuses such an engine, before vLLM's
constructor builds anything, with a message that says what to do, unless
`LPC_ALLOW_UNVERIFIED` names the configuration (`kv-groups`, `speculative-decoding`), which
then logs a warning.

Why these two: docs/design.md, "Engine checks and engine context".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KV_GROUPS = "kv-groups"
SPECULATIVE_DECODING = "speculative-decoding"
UNVERIFIED_NAMES = (KV_GROUPS, SPECULATIVE_DECODING)
ALLOW_VARIABLE = "LPC_ALLOW_UNVERIFIED"


class UnverifiedConfigurationError(RuntimeError):
    """The engine's configuration is one the plugin is not verified with."""


@dataclass(frozen=True)
class Unverified:
    name: str  # one of UNVERIFIED_NAMES
    what: str  # the engine's configuration, in words


def unverified_configurations(vllm_config: Any, kv_cache_config: Any) -> list[Unverified]:
    """What in this engine's configuration the plugin is not verified with."""
    found = []
    groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
    if len(groups) > 1:
        found.append(
            Unverified(
                KV_GROUPS,
                f"{len(groups)} KV cache groups (a hybrid model: sliding-window or Mamba "
                "layers beside full attention)",
            )
        )
    speculative = getattr(vllm_config, "speculative_config", None)
    if speculative is not None:
        method = getattr(speculative, "method", None)
        found.append(
            Unverified(
                SPECULATIVE_DECODING,
                "speculative decoding" + (f" ({method})" if method else ""),
            )
        )
    return found


def parse_allowed(text: str) -> tuple[str, ...]:
    """`LPC_ALLOW_UNVERIFIED`'s names, checked (an unknown one is an error, not ignored)."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in UNVERIFIED_NAMES]
    if unknown:
        raise ValueError(
            f"unknown name(s) {', '.join(map(repr, unknown))}; expected a comma-separated "
            f"subset of {', '.join(UNVERIFIED_NAMES)}"
        )
    return names


def check_engine(
    vllm_config: Any, kv_cache_config: Any, allowed: tuple[str, ...]
) -> list[Unverified]:
    """Raise `UnverifiedConfigurationError` for an unverified configuration not in `allowed`;
    return the allowed ones found (the caller warns about them)."""
    found = unverified_configurations(vllm_config, kv_cache_config)
    refused = [item for item in found if item.name not in allowed]
    if refused:
        names = ",".join(item.name for item in refused)
        raise UnverifiedConfigurationError(
            "the LPC eviction plugin is not verified with "
            + "; ".join(item.what for item in refused)
            + ". Serve this model without it (vLLM's own scheduler class), or set "
            f"{ALLOW_VARIABLE}={names} to run it anyway (vLLM's block accounting is "
            "unchanged; LPC's eviction order is untested there)"
        )
    return found
