"""What a sentence-transformers model folder declares: its modules, pooling, prompts, limits.

Reading the folder ourselves lets the common shape (Transformer → Pooling → Normalize, which
covers e5 and MiniLM) run on `transformers` alone: importing the sentence-transformers library
costs ~250 MB of resident memory (it pulls in datasets, pyarrow, pandas, scikit-learn) and
~8 s of start-up, which the prediction server should not pay. Other shapes fall back to the
library (`SentenceTransformerEmbedder` decides).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

TRANSFORMER = "sentence_transformers.models.Transformer"
POOLING = "sentence_transformers.models.Pooling"
NORMALIZE = "sentence_transformers.models.Normalize"
LEAN_MODULES = (TRANSFORMER, POOLING, NORMALIZE)
LEAN_POOLING_MODES = ("mean", "cls", "max")


@dataclass(frozen=True)
class FolderSpec:
    """A sentence-transformers folder this package can run without the library."""

    transformer_path: Path
    pooling_mode: str
    normalize: bool
    max_seq_length: int | None
    do_lower_case: bool
    prompts: dict[str, str] = field(default_factory=dict)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _short_type(module_type: str) -> str:
    # Newer releases write e.g. "sentence_transformers.sentence_transformer.modules.Pooling".
    name = module_type.rsplit(".", 1)[-1]
    return f"sentence_transformers.models.{name}"


def read_folder_spec(folder: Path) -> FolderSpec | None:
    """The spec of `folder`, or None when it needs the sentence-transformers library."""
    modules = _read_json(folder / "modules.json")
    if not isinstance(modules, list) or not modules:
        return None
    types = [_short_type(str(m.get("type", ""))) for m in modules]
    if types[0] != TRANSFORMER or any(t not in LEAN_MODULES for t in types):
        return None
    if types.count(TRANSFORMER) != 1 or types.count(POOLING) != 1:
        return None
    transformer_path = folder / modules[0].get("path", "")
    pooling_path = folder / modules[types.index(POOLING)].get("path", "")
    pooling = _read_json(pooling_path / "config.json")
    modes = [
        name
        for name in LEAN_POOLING_MODES
        if pooling.get(f"pooling_mode_{name}_tokens" if name != "cls" else "pooling_mode_cls_token")
    ]
    others = [
        k
        for k, v in pooling.items()
        if k.startswith("pooling_mode_") and v and not any(m in k for m in modes)
    ]
    if len(modes) != 1 or others or pooling.get("include_prompt", True) is False:
        return None
    bert_config = _read_json(transformer_path / "sentence_bert_config.json") or _read_json(
        folder / "sentence_bert_config.json"
    )
    prompts = _read_json(folder / "config_sentence_transformers.json").get("prompts") or {}
    return FolderSpec(
        transformer_path=transformer_path,
        pooling_mode=modes[0],
        normalize=NORMALIZE in types,
        max_seq_length=bert_config.get("max_seq_length"),
        do_lower_case=bool(bert_config.get("do_lower_case", False)),
        prompts={str(k): str(v) for k, v in prompts.items()},
    )
