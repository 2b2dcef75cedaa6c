"""Every reference in the code's text and the docs resolves: module paths (`training.x.y`),
markdown files (`docs/x.md`), numbered sections (`docs/x.md §3`) and feature names (the one
feature registry, `predictor.access_features`).

A docstring, help text or doc that points at a module, file, section or feature that does not
exist sends a reader nowhere; this test fails on the first such pointer, naming where it is.
"""

from __future__ import annotations

import ast
import bisect
import functools
import io
import re
import tokenize
from pathlib import Path

import pytest

from lpc.cli import train as train_command
from lpc.cli.main import build_parser
from predictor.access_features import FEATURES_BY_NAME, computable_on

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lpc", "predictor", "training", "eviction")
SOURCE_FOLDERS = (*PACKAGES, "scripts", "tests")
MODULE_PATH = re.compile(r"(?<![\w./-])(?:lpc|predictor|training|eviction)(?:\.[A-Za-z_]\w*)+")
MARKDOWN_FILE = re.compile(r"(?<![\w/.-])([\w./-]*[\w-]\.md)\b")
SECTION = re.compile(r"(?<![\w/.-])([\w./-]*[\w-]\.md)\)?\s*§\s*(\d+)(?:\s*[–-]\s*(\d+))?")
BARE_SECTION = re.compile(r"(?<![\w.)])§\s*(\d+)(?:\s*[–-]\s*(\d+))?")
NAMED_SECTION = re.compile(r"(?<![\w/.-])([\w./-]*[\w-]\.md),?\s+\"([^\"\n]+)\"")
# Files named in the text that the code writes (the A/B report), not documents to read.
GENERATED_MARKDOWN = {"report.md"}
FILE_SUFFIXES = ("md", "py", "toml", "json", "jsonl", "yaml", "yml", "txt", "csv", "png", "sh")
# This file's own examples of broken references are not references.
SELF = Path(__file__).resolve()
FEATURE_NAME = re.compile(r"`(log_[a-z_]+|reply_asks)`")


def python_files() -> list[Path]:
    return sorted(
        p
        for folder in SOURCE_FOLDERS
        for p in (REPO_ROOT / folder).rglob("*.py")
        if ".venv" not in p.parts and p.resolve() != SELF
    )


def markdown_files() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


# A string literal (any prefix, any quotes, escapes and backslash-newlines inside) or a comment,
# as the tokenize module reads them, found by one regular expression instead of tokenising every
# file (~4x faster over the repository; `test_the_scanner_reads_what_tokenize_reads` compares).
_STRING_BODIES = (
    r"'''[^'\\]*(?:(?:\\[\s\S]|'(?!''))[^'\\]*)*'''",
    r'"""[^"\\]*(?:(?:\\[\s\S]|"(?!""))[^"\\]*)*"""',
    r"'[^\n'\\]*(?:\\[\s\S][^\n'\\]*)*'",
    r'"[^\n"\\]*(?:\\[\s\S][^\n"\\]*)*"',
)
# Every match starts with "#", a quote or a prefix letter: the lookahead lets the scan skip
# any other position at once instead of trying each alternative there (~3x faster).
LEXEME = re.compile(
    r"(?=[#'\"rRbBuUfF])"
    r"(?:(?P<comment>#[^\r\n]*)|(?P<string>(?P<prefix>(?<!\w)[rRbBuUfF]{1,2}|)(?:"
    + "|".join(_STRING_BODIES)
    + ")))"
)


def python_texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string literal and comment: docstrings, help texts, messages."""
    texts = []
    source = path.read_text(encoding="utf-8")
    newlines = [match.start() for match in re.finditer("\n", source)]
    for match in LEXEME.finditer(source):
        line = bisect.bisect_left(newlines, match.start()) + 1
        token = match.group(0)
        if match.group("comment") is not None:
            texts.append((line, token))
            continue
        prefix = match.group("prefix")
        quotes = 3 if token[len(prefix) : len(prefix) + 3] in ('"""', "'''") else 1
        if prefix.lower() in ("", "u", "r") and ("\\" not in token or prefix.lower() == "r"):
            value = token[len(prefix) + quotes : -quotes]  # what literal_eval would return
        else:
            try:
                value = ast.literal_eval(token)
            except (ValueError, SyntaxError):  # an f-string: its literal parts are enough
                value = token
        texts.append((line, value if isinstance(value, str) else str(value)))
    return texts


def tokenize_texts(path: Path) -> list[tuple[int, str]]:
    """`python_texts` by the tokenize module: the reference the scanner is checked against."""
    texts = []
    source = path.read_text(encoding="utf-8")
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            texts.append((token.start[0], token.string))
        elif token.type == tokenize.STRING:
            try:
                value = ast.literal_eval(token.string)
            except (ValueError, SyntaxError):
                value = token.string
            texts.append((token.start[0], value if isinstance(value, str) else str(value)))
    return texts


def markdown_texts(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of each paragraph: a reference may wrap onto the next line."""
    paragraphs, start, lines = [], 1, []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            if not lines:
                start = number
            lines.append(line)
        elif lines:
            paragraphs.append((start, "\n".join(lines)))
            lines = []
    if lines:
        paragraphs.append((start, "\n".join(lines)))
    return paragraphs


@functools.cache
def source_text(path: Path) -> str:
    """A file's text, read once per process: the checks look up the same files many times."""
    return path.read_text(encoding="utf-8")


@functools.cache
def all_texts() -> tuple[tuple[Path, int, str], ...]:
    """Every text of every file, read once per process: four tests walk them (~2.5 s a walk)."""
    found = []
    for path in python_files():
        found.extend((path, line, text) for line, text in python_texts(path))
    for path in markdown_files():
        found.extend((path, line, text) for line, text in markdown_texts(path))
    return tuple(found)


def predictor_instance_attribute(dotted: str) -> bool:
    """`predictor.base_rate` in prose is an attribute of a `Predictor` held in a variable
    named `predictor`, when no module of that name exists and the class defines it."""
    parts = dotted.split(".")
    if parts[0] != "predictor" or len(parts) != 2:
        return False
    source = source_text(REPO_ROOT / "predictor" / "predictor.py")
    name = re.escape(parts[1])
    return re.search(rf"(def {name}\(|self\.{name}\b)", source) is not None


@functools.cache
def module_path_exists(dotted: str) -> bool:
    """A package or module path, optionally followed by names the module defines or imports."""
    if predictor_instance_attribute(dotted):
        return True
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = REPO_ROOT.joinpath(*parts[:cut])
        if base.with_suffix(".py").is_file():
            source = source_text(base.with_suffix(".py"))
        elif (base / "__init__.py").is_file():
            source = source_text(base / "__init__.py")
        else:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        # The first name after the module must be defined or imported there (the rest are
        # attributes of it: fields, methods, which the module text names too).
        return all(re.search(rf"\b{re.escape(name)}\b", source) for name in rest)
    return False


@functools.cache
def markdown_target(name: str, cited_in: Path) -> Path | None:
    for base in (cited_in.parent, REPO_ROOT, REPO_ROOT / "docs"):
        candidate = (base / name).resolve()
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def headings(path: Path) -> frozenset[str]:
    """A file's headings, each also without a trailing parenthesis (the modules it is about,
    as in "The kill switch (`vllm_queue.py`)"), which a citation may leave out."""
    text = source_text(path)
    found = {h.strip() for h in re.findall(r"^#{1,6}\s+(.+)$", text, flags=re.MULTILINE)}
    return frozenset(found | {re.sub(r"\s*\([^()]*\)$", "", h) for h in found})


@functools.cache
def numbered_sections(path: Path) -> frozenset[int]:
    text = source_text(path)
    return frozenset(int(n) for n in re.findall(r"^#{1,6}\s+(\d+)\.", text, flags=re.MULTILINE))


def sections_cited(start: str, end: str | None) -> range:
    return range(int(start), int(end or start) + 1)


def where(path: Path, line: int, text: str = "", offset: int = 0) -> str:
    return f"{path.relative_to(REPO_ROOT)}:{line + text[:offset].count(chr(10))}"


def test_module_paths_exist():
    missing = []
    for path, line, text in all_texts():
        for match in MODULE_PATH.finditer(text):
            dotted = match.group(0).rstrip(".")
            if dotted.rsplit(".", 1)[-1] in FILE_SUFFIXES:
                continue  # a file name such as lpc.toml
            if not module_path_exists(dotted):
                missing.append(f"{where(path, line, text, match.start())}: {dotted}")
    assert not missing, "references to modules that do not exist:\n" + "\n".join(missing)


def test_markdown_files_exist():
    missing = []
    for path, line, text in all_texts():
        if ".md" not in text:
            continue  # no match (each names a .md file); skipping it saves the regex's scan
        for match in MARKDOWN_FILE.finditer(text):
            if Path(match.group(1)).name in GENERATED_MARKDOWN:
                continue
            if markdown_target(match.group(1), path) is None:
                missing.append(f"{where(path, line, text, match.start())}: {match.group(1)}")
    assert not missing, "references to markdown files that do not exist:\n" + "\n".join(missing)


def test_sections_exist():
    missing = []
    for path, line, text in all_texts():
        if ".md" not in text and "§" not in text:
            continue  # none of the three patterns can match: each needs one or the other
        for match in SECTION.finditer(text):
            at = where(path, line, text, match.start())
            target = markdown_target(match.group(1), path)
            if target is None:
                missing.append(f"{at}: {match.group(0)} (no such file)")
                continue
            wanted = set(sections_cited(match.group(2), match.group(3)))
            if wanted - numbered_sections(target):
                missing.append(f"{at}: {match.group(0)} (no section {wanted})")
        for match in NAMED_SECTION.finditer(text):
            target = markdown_target(match.group(1), path)
            if target is not None and match.group(2) not in headings(target):
                at = where(path, line, text, match.start())
                missing.append(f"{at}: {match.group(0)} (no such heading)")
        if path.suffix != ".md":
            continue
        # A bare § in a markdown file is a section of that same file.
        for match in BARE_SECTION.finditer(text):
            if re.search(r"\.md\)?\s*$", text[: match.start()]):
                continue  # checked above against its file
            wanted = set(sections_cited(match.group(1), match.group(2)))
            if wanted - numbered_sections(path):
                at = where(path, line, text, match.start())
                missing.append(f"{at}: {match.group(0)} (no section {wanted})")
    assert not missing, "references to sections that do not exist:\n" + "\n".join(missing)


def test_feature_names_exist():
    """Backticked feature names in docs and docstrings are registered features."""
    missing = []
    for path, line, text in all_texts():
        for match in FEATURE_NAME.finditer(text):
            if match.group(1) not in FEATURES_BY_NAME:
                missing.append(f"{where(path, line, text, match.start())}: {match.group(1)}")
    assert not missing, "features that do not exist:\n" + "\n".join(missing)
    assert set(computable_on("window")) <= set(computable_on("sample"))


def _train_flag_help(flag: str) -> str:
    parser = build_parser()
    train = next(a for a in parser._actions if a.dest == "command").choices[
        train_command.register.__module__.rsplit(".", 1)[1]
    ]
    (action,) = [a for a in train._actions if flag in a.option_strings]
    return action.help


@pytest.mark.parametrize(
    "flag, paths", [("--finish-features", ("sample",)), ("--access-features", ("table", "state"))]
)
def test_train_help_lists_exactly_the_registry(flag, paths):
    """`lpc train --help` names every feature the flag takes, with when it is known."""
    listed = dict(
        re.findall(r"\b([a-z][a-z_]+) \((arrival|scheduling|release)\)", _train_flag_help(flag))
    )
    assert listed == {n: FEATURES_BY_NAME[n].known_at for n in computable_on(*paths)}


@pytest.mark.parametrize(
    "text, ok",
    [
        ("see `training.inputs`", False),
        ("see `training.pipeline.model_inputs`", True),
        ("REFERENCE.md §1", False),
        ("docs/training.md §5", True),
        ("docs/training.md §42", False),
        ('docs/predictor.md "Features"', True),
        ('docs/predictor.md "Feature rules"', False),
    ],
)
def test_the_checks_catch_what_they_should(text, ok):
    """The scanners themselves: a broken pointer of each kind is found, a good one is not."""
    problems = [m.group(0) for m in MODULE_PATH.finditer(text) if not module_path_exists(m[0])]
    for match in SECTION.finditer(text):
        target = markdown_target(match.group(1), REPO_ROOT / "README.md")
        wanted = set(sections_cited(match.group(2), match.group(3)))
        if target is None or wanted - numbered_sections(target):
            problems.append(match.group(0))
    for match in NAMED_SECTION.finditer(text):
        target = markdown_target(match.group(1), REPO_ROOT / "README.md")
        if target is None or match.group(2) not in headings(target):
            problems.append(match.group(0))
    assert (not problems) == ok, problems


def test_the_scanner_reads_what_tokenize_reads():
    """`python_texts` finds the same strings and comments, with the same values and lines, as
    the tokenize module, on this file (raw strings, escapes, quotes in strings, f-strings) and
    a spread of the repository's files."""
    files = [SELF, *python_files()[::40]]
    for path in files:
        assert python_texts(path) == tokenize_texts(path), path
