"""The core and the extras: pyproject.toml, `lpc.cli.extras` and the CLI's missing-extra errors.

The core install itself (a clean venv, no torch, the plugin running) is
tests/test_core_install.py; here, what can be checked in the full environment: the table of
optional modules matches pyproject.toml, no extra's library is a core dependency, and a
command whose extra is missing answers with one line naming the `pip install` to run.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from lpc.cli import extras
from lpc.cli import main as cli

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
CORE = {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in PROJECT["dependencies"]}
HEAVY = {"torch", "transformers", "datasets", "sentence-transformers", "pandas"}


def distributions(extra: str) -> set[str]:
    """The distributions an extra of pyproject.toml brings, its `lpc[...]` includes too."""
    found = set()
    for requirement in PROJECT["optional-dependencies"][extra]:
        included = re.fullmatch(r"lpc\[([a-z,]+)\]", requirement)
        if included:
            for name in included.group(1).split(","):
                found |= distributions(name)
        else:
            found.add(re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower())
    return found


def test_the_core_has_none_of_the_heavy_libraries() -> None:
    assert {"numpy", "xxhash", "safetensors", "httpx", "prometheus-client"} == CORE
    assert not CORE & HEAVY
    assert not CORE & {m.distribution for m in extras.OPTIONAL_MODULES.values()}


def test_the_optional_modules_table_matches_pyproject() -> None:
    for name, module in extras.OPTIONAL_MODULES.items():
        assert module.distribution in distributions(module.extra), (name, module)
    named = {m.distribution for m in extras.OPTIONAL_MODULES.values()}
    for extra in ("replay", "text", "data", "train", "serve", "rivals", "ray"):
        assert distributions(extra) <= named, f"{extra}: a distribution with no import name"
    for extra, included in extras.EXTRAS_INCLUDE.items():
        listed = {
            name
            for requirement in PROJECT["optional-dependencies"][extra]
            if (m := re.fullmatch(r"lpc\[([a-z,]+)\]", requirement))
            for name in m.group(1).split(",")
        }
        assert listed == set(included), extra
    assert distributions("all") == set().union(
        *(distributions(e) for e in ("replay", "text", "data", "train", "serve", "rivals", "ray"))
    )


def test_require_names_every_missing_module(monkeypatch: pytest.MonkeyPatch) -> None:
    real = extras.importlib.util.find_spec
    absent = {"datasets", "sklearn"}
    monkeypatch.setattr(
        extras.importlib.util, "find_spec", lambda n: None if n in absent else real(n)
    )
    extras.require("replay", "text")  # installed
    with pytest.raises(extras.MissingExtraError) as error:
        extras.require("train")
    message = str(error.value)
    assert "lpc[train]" in message and "pip install 'lpc[train]'" in message
    assert "datasets" in message and "sklearn" in message
    with pytest.raises(ValueError, match="unknown extra"):
        extras.require("gpu")


def test_a_missing_optional_module_is_one_line_naming_its_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from lpc.cli import bench_log

    def no_pandas(args: object) -> int:
        raise ModuleNotFoundError("No module named 'pandas'", name="pandas")

    monkeypatch.setattr(bench_log, "run", no_pandas)
    assert cli.main(["bench", "log"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "lpc bench: error: this command needs 'pandas' (pandas), which the core install leaves "
        "out: pip install 'lpc[replay]' (or 'lpc[all]' for every command)"
    ]


def test_a_missing_module_of_our_own_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    from lpc.cli import bench_log

    def bug(args: object) -> int:
        raise ModuleNotFoundError(
            "No module named 'lpc_private_missing'", name="lpc_private_missing"
        )

    monkeypatch.setattr(bench_log, "run", bug)
    with pytest.raises(ModuleNotFoundError):
        cli.main(["bench", "log"])


def test_a_command_checks_its_extra_first(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    real = extras.importlib.util.find_spec
    monkeypatch.setattr(
        extras.importlib.util, "find_spec", lambda n: None if n == "fastapi" else real(n)
    )
    assert cli.main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "lpc serve: error: this command needs lpc[serve]" in err and "fastapi" in err
