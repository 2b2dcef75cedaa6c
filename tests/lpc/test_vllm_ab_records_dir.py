"""`lpc vllm-ab --records-dir` is checked before any engine starts (a sibling of issue 44's
case 11: the engines write their per-step records there)."""

from __future__ import annotations

from pathlib import Path

from lpc.cli.main import main


def test_vllm_ab_checks_its_records_folder_before_the_engines_start(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    python = tmp_path / "python"
    python.write_text("")  # the check comes before any engine is started with it
    records = tmp_path / "file"
    records.write_text("x")
    args = ["vllm-ab", "mooncake", "--kv-tokens", "4096", "--vllm-python", str(python)]
    assert main([*args, "--records-dir", str(records / "r")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"lpc vllm-ab: error: --records-dir {records / 'r'}: {records} exists and is not a folder"
    )
