"""Bad input through the CLI's entry point: one line on stderr, exit status 2, no traceback;
a bug (any other exception) keeps its traceback instead of passing for bad input.

The cases run `lpc.cli.main.main` in process (what `python -m lpc.cli` calls, stdout and
stderr captured); only what a process alone can show starts one: that bad data is refused
before torch is imported, and that a hub data set is refused offline (the hub reads its
offline switch when it is first imported).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from lpc.cli import main as cli
from lpc.errors import CommandError, UserError

REPO_ROOT = Path(__file__).resolve().parents[2]
PNG_BYTES = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4 + b"\nIEND\xaeB`\x82\n"


@dataclass
class CliResult:
    """What a run of `lpc` gave: its exit status and what it printed."""

    returncode: int
    stdout: str
    stderr: str


CliRunner = Callable[..., CliResult]


@pytest.fixture
def run_cli(capsys, monkeypatch) -> CliRunner:
    """`lpc ARGS` in this process, from the repository root, offline."""
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")

    def run(*args: str) -> CliResult:
        capsys.readouterr()  # nothing printed before belongs to this run
        try:
            status = cli.main(list(args))
        except SystemExit as exit_:  # argparse's usage errors
            status = exit_.code if isinstance(exit_.code, int) else 1
        printed = capsys.readouterr()
        return CliResult(status, printed.out, printed.err)

    return run


def run_python(*argv: str) -> subprocess.CompletedProcess[str]:
    """This checkout's Python in a fresh process, offline (no hub), from the repository root."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=300,
    )


def assert_one_line_error(
    result: CliResult | subprocess.CompletedProcess[str], verb: str, *words: str
) -> str:
    errors = [line for line in result.stderr.splitlines() if line.startswith(f"lpc {verb}: ")]
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert len(errors) == 1 and errors[0].startswith(f"lpc {verb}: error: "), result.stderr
    for word in words:
        assert word in errors[0], errors[0]
    assert result.stderr.strip() == errors[0], "stderr holds more than the error line"
    return errors[0]


@pytest.fixture
def bad_data(tmp_path: Path) -> dict[str, Path]:
    png = tmp_path / "picture.jsonl"
    png.write_bytes(PNG_BYTES)
    assistant_only = tmp_path / "assistant_only.jsonl"
    assistant_only.write_text(
        "".join(
            json.dumps({"id": f"c{i}", "conversations": [{"from": "gpt", "value": "hello"}]}) + "\n"
            for i in range(3)
        )
    )
    single_turn = tmp_path / "single_turn.jsonl"
    single_turn.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"c{i}",
                    "conversations": [
                        {"from": "human", "value": f"question {i}"},
                        {"from": "gpt", "value": "answer"},
                    ],
                }
            )
            + "\n"
            for i in range(60)
        )
        + json.dumps({"id": "reply", "conversations": [{"from": "gpt", "value": "hi"}]})
        + "\n"
    )
    empty_folder = tmp_path / "empty"
    empty_folder.mkdir()
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    return {
        "png": png,
        "assistant_only": assistant_only,
        "single_turn": single_turn,
        "empty_folder": empty_folder,
        "a_file": a_file,
    }


SEPARATOR = "\n--- next run ---\n"


@pytest.fixture(scope="module")
def fresh_process(tmp_path_factory) -> dict[str, CliResult]:
    """The two checks only a fresh process can make, in one process started for both (each
    run's stdout and stderr apart): a PNG given as a data set is refused before torch is
    imported (checked right after that run, before anything else runs), then a hub data set
    is refused offline (the hub is first imported by that run, with the offline switch set)."""
    tmp_path = tmp_path_factory.mktemp("fresh")
    png = tmp_path / "picture.jsonl"
    png.write_bytes(PNG_BYTES)
    probe = (
        "import sys\n"
        "from lpc.cli.main import main\n"
        f"status = main(['ab', '--dataset', {str(png)!r}, '--format', 'lmsys',"
        f" '--out', {str(tmp_path / 'png')!r}])\n"
        "print('exit', status, 'torch' in sys.modules)\n"
        f"for stream in (sys.stdout, sys.stderr): stream.write({SEPARATOR!r}); stream.flush()\n"
        f"sys.exit(main(['ab', '--dataset', 'hf:nosuch/dataset', '--out',"
        f" {str(tmp_path / 'hub')!r}]))\n"
    )
    done = run_python("-c", probe)
    assert done.stdout.count(SEPARATOR) == 1, (done.stdout[-2000:], done.stderr[-2000:])
    assert done.stderr.count(SEPARATOR) == 1, done.stderr[-2000:]
    png_out, hub_out = done.stdout.split(SEPARATOR)
    png_err, hub_err = done.stderr.split(SEPARATOR)
    return {  # the first run's status is what it printed, as 'exit STATUS TORCH_LOADED'
        "png": CliResult(-1, png_out, png_err),
        "hub": CliResult(done.returncode, hub_out, hub_err),
    }


def test_ab_missing_dataset(run_cli, tmp_path: Path):
    result = run_cli("ab", "--dataset", str(tmp_path / "nonexistent"), "--out", str(tmp_path))
    assert_one_line_error(result, "ab", "nonexistent", "no such file or folder")


def test_ab_empty_folder(run_cli, bad_data, tmp_path: Path):
    result = run_cli("ab", "--dataset", str(bad_data["empty_folder"]), "--out", str(tmp_path))
    assert_one_line_error(result, "ab", "no data files")


def test_ab_hub_dataset_offline(fresh_process):
    assert_one_line_error(fresh_process["hub"], "ab", "nosuch/dataset")


def test_ab_out_is_a_file(run_cli, bad_data):
    result = run_cli("ab", "--out", str(bad_data["a_file"]), "--no-progress")
    assert_one_line_error(result, "ab", "--out", "not a folder")


def test_ab_out_below_a_file(run_cli, bad_data):
    result = run_cli("ab", "--out", str(bad_data["a_file"] / "ab"), "--no-progress")
    assert_one_line_error(result, "ab", "--out", "not a folder")


def test_ab_empty_policies(run_cli, tmp_path: Path):
    result = run_cli("ab", "--policies", "", "--out", str(tmp_path))
    assert_one_line_error(result, "ab", "--policies", "no policy given")


def test_ab_binary_file_as_jsonl(run_cli, bad_data, tmp_path: Path):
    """Every format's loader refuses it (tests/training/test_loaders_readers.py); one CLI run."""
    result = run_cli(
        "ab", "--dataset", str(bad_data["png"]), "--format", "lmsys", "--out", str(tmp_path)
    )
    assert_one_line_error(result, "ab", "picture.jsonl", "not JSON Lines")


def test_ab_refuses_bad_data_before_it_loads_torch(fresh_process):
    """The default policies need the bundled text model, whose predictor brings torch (seconds
    to import); the data set is read first, so bad data is refused without it."""
    done = fresh_process["png"]
    assert "not JSON Lines" in done.stderr, done.stderr[-2000:]
    assert done.stdout.split()[-3:] == ["exit", "2", "False"], done.stdout[-2000:]


@pytest.mark.parametrize("verb", ["ab", "train"])
def test_no_usable_conversation_is_refused_with_what_was_skipped(run_cli, bad_data, tmp_path, verb):
    out = tmp_path / "out"
    result = run_cli(verb, "--dataset", str(bad_data["assistant_only"]), "--out", str(out))
    assert_one_line_error(
        result, verb, "no usable conversations", "3 records read", "no_user_message 3"
    )


def test_ab_refuses_an_empty_evaluation_half(run_cli, tmp_path: Path):
    """One conversation, hashed into the training half: nothing to replay, not a 0 % table."""
    turns = [{"from": r, "value": v} for r, v in [("human", "q1"), ("gpt", "a"), ("human", "q2")]]
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"id": "x1", "conversations": turns}) + "\n")
    result = run_cli("ab", "--dataset", str(data), "--policies", "lru", "--out", str(tmp_path))
    assert_one_line_error(result, "ab", "none in the evaluation half")
    assert not (tmp_path / "results.csv").exists()


def test_train_refuses_samples_of_one_label(run_cli, bad_data, tmp_path: Path):
    out = tmp_path / "model"
    result = run_cli("train", "--dataset", str(bad_data["single_turn"]), "--out", str(out))
    assert_one_line_error(result, "train", "all 26 training samples are label 0")
    assert not out.exists()
    # The load's summary line shows what was skipped and cleaned, not only the counts.
    (data_line,) = [line for line in result.stdout.splitlines() if line.startswith("data: ")]
    assert "61 records read, 60 conversations; skipped: no_user_message 1" in data_line
    assert "cleaned: leading assistant messages dropped 1" in data_line


def test_serve_model_is_checked_not_abbreviated(run_cli, bad_data, tmp_path: Path):
    corrupt = tmp_path / "corrupt-model"
    corrupt.mkdir()
    (corrupt / "metadata.json").write_text("{ not json")
    result = run_cli("serve", "--model", str(corrupt), "--port", "0")
    assert_one_line_error(result, "serve", "corrupt-model")


def test_flag_prefixes_are_not_expanded(run_cli, tmp_path: Path):
    result = run_cli("serve", "--model-r", str(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "unrecognized arguments: --model-r" in result.stderr


def test_no_parser_abbreviates_flags():
    parsers = cli.all_parsers(cli.build_parser())
    assert len(parsers) > 8  # lpc, its verbs and their sub-verbs
    assert all(not p.allow_abbrev for p in parsers)


def _main_running(run, monkeypatch) -> int:
    """`cli.main` with the parsed `lpc ab` arguments but this `run`."""
    args = cli.build_parser().parse_args(["ab"])
    args.run = run
    parser = argparse.ArgumentParser()
    monkeypatch.setattr(parser, "parse_args", lambda argv: args)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    return cli.main([])


def test_a_user_error_is_one_line_exit_2(capsys, monkeypatch):
    def fail(_: argparse.Namespace) -> int:
        raise CommandError("--flag: what is wrong")

    assert _main_running(fail, monkeypatch) == 2
    assert capsys.readouterr().err == "lpc ab: error: --flag: what is wrong\n"


def test_a_bug_keeps_its_traceback(monkeypatch):
    """A ValueError that is not a UserError is a bug: main lets it propagate."""

    def buggy(_: argparse.Namespace) -> int:
        raise ValueError("an internal invariant broke")

    with pytest.raises(ValueError, match="internal invariant"):
        _main_running(buggy, monkeypatch)


def test_input_errors_are_user_errors():
    from lpc.traces.lpc_trace import TraceError
    from predictor.artifact import ArtifactError
    from predictor.embedders import EmbedderLoadError
    from predictor.features import FeatureConfigError
    from training.loaders import (
        DatasetNotFoundError,
        DatasetUnavailableError,
        EmptyDatasetError,
        LoaderError,
        MalformedFileError,
    )

    for error in (
        TraceError,
        ArtifactError,
        EmbedderLoadError,
        FeatureConfigError,
        LoaderError,
        DatasetNotFoundError,
        DatasetUnavailableError,
        EmptyDatasetError,
        MalformedFileError,
        CommandError,
    ):
        assert issubclass(error, UserError), error
    assert not issubclass(ValueError, UserError)
