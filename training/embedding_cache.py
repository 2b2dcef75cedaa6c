"""Window embeddings computed once and kept on disk, shared by training and the A/B harness.

Embedding is the only expensive step of training (the embedder is frozen), so every vector is
computed once per embedder and reused across epochs, runs, data sets and the A/B harness. The
cache is keyed by the embedder id, the feature configuration and the text itself, checked
against probe texts when opened, and written in atomic, resumable chunks.

The layout and its guarantees: docs/design.md, "The embedding cache".
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from predictor.atomic_files import atomic_path, write_text_atomically
from predictor.embedders.base import Embedder
from predictor.errors import InvalidInputError, UserError
from predictor.features import FeatureConfig, WindowTextBuilder

logger = logging.getLogger(__name__)

CACHE_FORMAT_VERSION = "v1"
KEY_BYTES = 16
PROBE_TEXTS = (
    "How do I reverse a linked list in Python?",
    "Écris un poème sur la mer, s'il te plaît. 谢谢!",
)
PROBE_MIN_COSINE = 0.999
DEFAULT_CHUNK_WINDOWS = 2048
NAMESPACE_FILE = "namespace.json"

EmbedderFactory = Callable[[], Embedder]


class EmbeddingCacheError(UserError, RuntimeError):
    """The cache cannot be used as asked (wrong vector size, unreadable namespace, …)."""


@dataclass(frozen=True)
class EmbedOptions:
    """How missing vectors are computed.

    `batch_size`: texts per forward pass. `devices`: None for the embedder's own device; two or
    more (e.g. `("cuda:0", "cuda:1")` or `("cpu",) * 8`) spread each chunk over a
    sentence-transformers multi-process pool, one process per entry. `chunk_windows`: windows
    per resumable unit of work. `progress`: show a progress bar.
    """

    batch_size: int = 32
    devices: tuple[str, ...] | None = None
    chunk_windows: int = DEFAULT_CHUNK_WINDOWS
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("batch_size", "chunk_windows"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidInputError(
                    f"EmbedOptions.{name} must be a positive integer, got {value!r}"
                )
        if self.devices is not None:
            devices = tuple(self.devices)
            object.__setattr__(self, "devices", devices)
            if not devices or not all(isinstance(d, str) and d for d in devices):
                raise InvalidInputError(
                    f"EmbedOptions.devices must be non-empty device names, got {self.devices!r}"
                )


@dataclass
class EmbedStats:
    """What one `embeddings_for` call did: for progress reports and timing."""

    windows: int = 0
    windows_cached: int = 0
    texts_built: int = 0
    texts_embedded: int = 0
    embed_seconds: float = 0.0
    build_seconds: float = 0.0
    chunks_written: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def texts_per_second(self) -> float:
        return self.texts_embedded / self.embed_seconds if self.embed_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "windows": self.windows,
            "windows_cached": self.windows_cached,
            "texts_built": self.texts_built,
            "texts_embedded": self.texts_embedded,
            "embed_seconds": round(self.embed_seconds, 3),
            "build_seconds": round(self.build_seconds, 3),
            "texts_per_second": round(self.texts_per_second, 3),
            "chunks_written": self.chunks_written,
        }


def window_key(prompts: Sequence[str]) -> bytes:
    """Hash of a window's prompts (length-prefixed, so prompt boundaries count)."""
    digest = hashlib.sha256()
    for prompt in prompts:
        encoded = prompt.encode("utf-8", "surrogatepass")
        digest.update(len(encoded).to_bytes(8, "little"))
        digest.update(encoded)
    return digest.digest()[:KEY_BYTES]


def text_key(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:KEY_BYTES]


def namespace_name(embedder_id: str) -> str:
    """A readable, filesystem-safe folder name that is unique per embedder id."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", embedder_id).strip("_")[:60] or "embedder"
    digest = hashlib.sha256(embedder_id.encode("utf-8")).hexdigest()[:12]
    return f"{slug}-{digest}"


def _write_table_atomically(path: Path, table) -> None:
    """Arrow IPC file written to a temporary sibling, synced, then renamed into place."""
    import pyarrow as pa

    with (
        atomic_path(path) as temporary,
        pa.OSFile(str(temporary), "wb") as sink,
        pa.ipc.new_file(sink, table.schema) as writer,
    ):
        writer.write_table(table)


def _read_table(path: Path):
    import pyarrow as pa

    with pa.memory_map(str(path), "r") as source:
        return pa.ipc.open_file(source).read_all()


def _unique_name(prefix: str) -> str:
    return f"{prefix}-{time.time_ns():020d}-{os.getpid()}.arrow"


def _key_array(keys: Sequence[bytes]):
    import pyarrow as pa

    return pa.array(list(keys), type=pa.binary(KEY_BYTES))


class VectorStore:
    """text key → vector, over the shard files of one namespace (loaded into memory)."""

    def __init__(self, folder: Path, dim: int) -> None:
        self.folder = folder
        self.dim = dim
        self._index: dict[bytes, int] = {}
        self._blocks: list[np.ndarray] = []
        self._offsets: list[int] = []
        self._size = 0
        self._loaded: set[str] = set()
        self.refresh()

    def refresh(self) -> None:
        """Pick up shards written since the last look (by this or another process)."""
        if not self.folder.is_dir():
            return
        for path in sorted(self.folder.glob("shard-*.arrow")):
            if path.name not in self._loaded:
                self._add_table(_read_table(path), path)
                self._loaded.add(path.name)

    def _add_table(self, table, path: Path | None = None) -> None:
        keys = table.column("text_key").to_pylist()
        flat = table.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        vectors = np.asarray(flat, dtype=np.float32).reshape(len(keys), -1)
        if len(keys) and vectors.shape[1] != self.dim:
            raise EmbeddingCacheError(
                f"{path}: vectors of size {vectors.shape[1]}, the namespace holds {self.dim}"
            )
        self._offsets.append(self._size)
        self._blocks.append(vectors)
        for row, key in enumerate(keys):
            self._index.setdefault(key, self._size + row)
        self._size += len(keys)

    def __contains__(self, key: bytes) -> bool:
        return key in self._index

    def __len__(self) -> int:
        return len(self._index)

    def get_many(self, keys: Sequence[bytes]) -> np.ndarray:
        """Vectors for `keys` (all present), float32 (len(keys), dim)."""
        out = np.empty((len(keys), self.dim), dtype=np.float32)
        if not keys:
            return out
        rows = np.fromiter((self._index[k] for k in keys), dtype=np.int64, count=len(keys))
        starts = np.asarray(self._offsets, dtype=np.int64)
        block_of = np.searchsorted(starts, rows, side="right") - 1
        for b in np.unique(block_of):
            selected = block_of == b
            out[selected] = self._blocks[b][rows[selected] - starts[b]]
        return out

    def add(self, keys: Sequence[bytes], vectors: np.ndarray) -> None:
        """Write one shard durably, then make it visible in memory."""
        import pyarrow as pa

        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.shape != (len(keys), self.dim):
            raise EmbeddingCacheError(
                f"expected vectors of shape ({len(keys)}, {self.dim}), got {vectors.shape}"
            )
        column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), self.dim)
        table = pa.table({"text_key": _key_array(keys), "vector": column})
        name = _unique_name("shard")
        _write_table_atomically(self.folder / name, table)
        self._add_table(table)
        self._loaded.add(name)


class TextIndex:
    """window key → text key for one feature configuration (all parts loaded into memory)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._map: dict[bytes, bytes] = {}
        self._loaded: set[str] = set()
        self.refresh()

    def refresh(self) -> None:
        if not self.folder.is_dir():
            return
        for path in sorted(self.folder.glob("part-*.arrow")):
            if path.name not in self._loaded:
                table = _read_table(path)
                windows = table.column("window_key").to_pylist()
                texts = table.column("text_key").to_pylist()
                for w, t in zip(windows, texts, strict=True):
                    self._map.setdefault(w, t)
                self._loaded.add(path.name)

    def get(self, key: bytes) -> bytes | None:
        return self._map.get(key)

    def __len__(self) -> int:
        return len(self._map)

    def add(self, window_keys: Sequence[bytes], text_keys: Sequence[bytes]) -> None:
        import pyarrow as pa

        table = pa.table({"window_key": _key_array(window_keys), "text_key": _key_array(text_keys)})
        name = _unique_name("part")
        _write_table_atomically(self.folder / name, table)
        for w, t in zip(window_keys, text_keys, strict=True):
            self._map.setdefault(w, t)
        self._loaded.add(name)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    denominator = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(np.dot(a, b) / denominator) if denominator > 0 else 0.0


class EmbeddingCache:
    """The cached embeddings of one embedder (docs/design.md, "The embedding cache").

    Open with `EmbeddingCache.open(root, embedder_id, dim, embedder_factory)`; the embedder is
    only loaded (through the factory) when texts must be built or vectors computed, or when
    `verify=True` asks for the probe check up front.
    """

    def __init__(
        self, folder: Path, embedder_id: str, dim: int, embedder_factory: EmbedderFactory | None
    ) -> None:
        self.folder = folder
        self.embedder_id = embedder_id
        self.dim = dim
        self._factory = embedder_factory
        self._embedder: Embedder | None = None
        self.vectors = VectorStore(folder / "vectors", dim)
        self._text_indexes: dict[str, TextIndex] = {}

    @classmethod
    def open(
        cls,
        root: Path | str,
        embedder_id: str,
        dim: int,
        embedder_factory: EmbedderFactory | None = None,
        verify: bool = False,
        embedder: Embedder | None = None,
    ) -> EmbeddingCache:
        """The cache of `embedder_id` under `root` (created when missing).

        Pass `embedder` when it is already loaded, else `embedder_factory` to load it lazily.
        """
        if not isinstance(embedder_id, str) or not embedder_id:
            raise ValueError(f"embedder_id must be a non-empty string, got {embedder_id!r}")
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        if embedder is not None:
            if embedder.embedder_id != embedder_id or embedder.dim != dim:
                raise EmbeddingCacheError(
                    f"embedder {embedder.embedder_id!r} ({embedder.dim}-dim) does not match "
                    f"the cache asked for: {embedder_id!r} ({dim}-dim)"
                )
            embedder_factory = lambda: embedder  # noqa: E731
        folder = Path(root) / CACHE_FORMAT_VERSION / namespace_name(embedder_id)
        folder.mkdir(parents=True, exist_ok=True)
        cache = cls(folder, embedder_id, dim, embedder_factory)
        cache._check_namespace_file()
        if embedder is not None:
            cache._embedder = embedder
            cache._verify_probe()
        elif verify:
            cache.embedder()
        return cache

    # --- namespace and staleness -------------------------------------------------------
    def _namespace_path(self) -> Path:
        return self.folder / NAMESPACE_FILE

    def _read_namespace(self) -> dict | None:
        path = self._namespace_path()
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise EmbeddingCacheError(
                f"{path} is unreadable ({error}); delete the folder {self.folder} to rebuild it"
            ) from error
        return data if isinstance(data, dict) else None

    def _check_namespace_file(self) -> None:
        data = self._read_namespace()
        if data is None:
            return
        if data.get("embedder_id") != self.embedder_id or data.get("dim") != self.dim:
            raise EmbeddingCacheError(
                f"{self._namespace_path()} belongs to embedder {data.get('embedder_id')!r} "
                f"({data.get('dim')}-dim), not {self.embedder_id!r} ({self.dim}-dim)"
            )

    def embedder(self) -> Embedder:
        """The embedder, loaded on first use and checked against the namespace's probes."""
        if self._embedder is None:
            if self._factory is None:
                raise EmbeddingCacheError(
                    f"the cache for {self.embedder_id!r} needs the embedder to compute missing "
                    "vectors, and none was given"
                )
            embedder = self._factory()
            if embedder.embedder_id != self.embedder_id or embedder.dim != self.dim:
                raise EmbeddingCacheError(
                    f"the embedder loaded is {embedder.embedder_id!r} ({embedder.dim}-dim), "
                    f"the cache is for {self.embedder_id!r} ({self.dim}-dim)"
                )
            self._embedder = embedder
            self._verify_probe()
        return self._embedder

    def _verify_probe(self) -> None:
        assert self._embedder is not None
        probes = np.asarray(self._embedder.embed(list(PROBE_TEXTS), batch_size=1), np.float32)
        data = self._read_namespace()
        if data is not None:
            stored = np.asarray(data.get("probe_vectors", []), dtype=np.float32)
            agree = stored.shape == probes.shape and all(
                _cosine(a, b) >= PROBE_MIN_COSINE for a, b in zip(stored, probes, strict=True)
            )
            if agree:
                return
            retired = self.folder.with_name(f"{self.folder.name}.stale-{time.time_ns()}")
            self.folder.rename(retired)
            logger.warning(
                "embedding cache %s: the embedder %r no longer gives the vectors it "
                "gave when the cache was written; moved the old vectors to %s",
                self.folder,
                self.embedder_id,
                retired,
            )
            self.folder.mkdir(parents=True)
            self.vectors = VectorStore(self.folder / "vectors", self.dim)
            self._text_indexes = {}
        payload = {
            "embedder_id": self.embedder_id,
            "dim": self.dim,
            "probe_texts": list(PROBE_TEXTS),
            "probe_vectors": probes.tolist(),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        write_text_atomically(self._namespace_path(), json.dumps(payload, indent=1) + "\n")

    def text_index(self, config: FeatureConfig) -> TextIndex:
        fingerprint = config.fingerprint()
        if fingerprint not in self._text_indexes:
            folder = self.folder / "texts" / fingerprint
            folder.mkdir(parents=True, exist_ok=True)
            config_file = folder / "feature_config.json"
            if not config_file.exists():
                write_text_atomically(config_file, json.dumps(config.to_dict(), indent=1) + "\n")
            self._text_indexes[fingerprint] = TextIndex(folder)
        return self._text_indexes[fingerprint]

    # --- the one public operation --------------------------------------------------------
    def embeddings_for(
        self,
        windows: Sequence[Sequence[str]],
        config: FeatureConfig,
        options: EmbedOptions | None = None,
        stats: EmbedStats | None = None,
    ) -> np.ndarray:
        """float32 (len(windows), dim): the embedding of each window's prompts (oldest first;
        only the last `config.window_size` are used), computing and caching what is missing.

        `window_encoding="prompt_mean"` embeds each prompt alone (cached like a one-prompt
        window) and returns the re-normalised mean of a window's prompt vectors, exactly as
        `predictor.Predictor` serves it."""
        options = options or EmbedOptions()
        stats = stats if stats is not None else EmbedStats()
        size = config.window_size
        recent = [tuple(w[-size:]) for w in windows]
        if config.window_encoding == "prompt_mean":
            return self._prompt_means(recent, config, options, stats)
        return self._vectors_of(recent, config, options, stats)

    def _prompt_means(
        self,
        recent: list[tuple[str, ...]],
        config: FeatureConfig,
        options: EmbedOptions,
        stats: EmbedStats,
    ) -> np.ndarray:
        prompts = list(dict.fromkeys(p for window in recent for p in window))
        vectors = self._vectors_of([(p,) for p in prompts], config, options, stats)
        row = {p: i for i, p in enumerate(prompts)}
        out = np.empty((len(recent), self.dim), dtype=np.float32)
        for i, window in enumerate(recent):
            mean = np.mean([vectors[row[p]] for p in window], axis=0)
            out[i] = mean / max(float(np.linalg.norm(mean)), 1e-12)
        return out

    def _vectors_of(
        self,
        recent: list[tuple[str, ...]],
        config: FeatureConfig,
        options: EmbedOptions,
        stats: EmbedStats,
    ) -> np.ndarray:
        """One cached vector per unit: a window (joined) or a single prompt (prompt_mean)."""
        windows = recent
        keys = [window_key(w) for w in recent]
        index = self.text_index(config)
        missing = [
            i for i, k in enumerate(keys) if (t := index.get(k)) is None or t not in self.vectors
        ]
        if missing:
            self.vectors.refresh()
            index.refresh()
            missing = [
                i
                for i, k in enumerate(keys)
                if (t := index.get(k)) is None or t not in self.vectors
            ]
        stats.windows += len(windows)
        stats.windows_cached += len(windows) - len(missing)
        if missing:
            self._fill(recent, keys, missing, config, options, stats)
        text_keys = [index.get(k) for k in keys]
        return self.vectors.get_many(text_keys)  # type: ignore[arg-type]

    def _fill(
        self,
        recent: list[tuple[str, ...]],
        keys: list[bytes],
        missing: list[int],
        config: FeatureConfig,
        options: EmbedOptions,
        stats: EmbedStats,
    ) -> None:
        from predictor.features import ConversationWindow

        embedder = self.embedder()
        builder = WindowTextBuilder(config, embedder.tokenizer, embedder.max_input_tokens)
        index = self.text_index(config)
        unique = list(dict.fromkeys(keys[i] for i in missing))
        first_row = {}
        for i in missing:
            first_row.setdefault(keys[i], i)
        bar = tqdm(
            total=len(unique),
            desc="embedding windows",
            unit="win",
            disable=not options.progress,
            dynamic_ncols=True,
            mininterval=2.0,
        )
        with bar, TextEncoder(embedder, options) as encoder:
            for start in range(0, len(unique), options.chunk_windows):
                chunk = unique[start : start + options.chunk_windows]
                t0 = time.perf_counter()
                if config.window_encoding == "prompt_mean":  # units are single prompts
                    texts = builder.prompt_texts([recent[first_row[k]][0] for k in chunk])
                else:
                    texts = builder.build(
                        [
                            ConversationWindow("w", recent[first_row[k]], len(recent[first_row[k]]))
                            for k in chunk
                        ]
                    )
                tkeys = [text_key(t) for t in texts]
                stats.build_seconds += time.perf_counter() - t0
                stats.texts_built += len(texts)
                todo: dict[bytes, str] = {}
                for tk, text in zip(tkeys, texts, strict=True):
                    if tk not in self.vectors and tk not in todo:
                        todo[tk] = text
                if todo:
                    t0 = time.perf_counter()
                    vectors = encoder.encode(list(todo.values()))
                    stats.embed_seconds += time.perf_counter() - t0
                    stats.texts_embedded += len(todo)
                    self.vectors.add(list(todo), vectors)
                index.add(chunk, tkeys)
                stats.chunks_written += 1
                bar.update(len(chunk))
                if stats.texts_per_second:
                    bar.set_postfix(texts_per_s=f"{stats.texts_per_second:.1f}")


class TextEncoder:
    """Embeds texts longest first (little padding per batch), on one device or on a
    sentence-transformers multi-process pool (one worker per entry of `options.devices`,
    started once and reused for every chunk). Use as a context manager."""

    def __init__(self, embedder: Embedder, options: EmbedOptions) -> None:
        self.embedder = embedder
        self.options = options
        self._pool = None

    def __enter__(self) -> TextEncoder:
        devices = self.options.devices
        if devices is not None and len(devices) > 1:
            from predictor.embedders import SentenceTransformerEmbedder

            if not isinstance(self.embedder, SentenceTransformerEmbedder):
                raise EmbeddingCacheError(
                    "several devices need a sentence-transformers embedder, not "
                    f"{self.embedder.embedder_id!r}"
                )
            self._pool = self.embedder.library_model().start_multi_process_pool(list(devices))
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._pool is not None:
            self.embedder.library_model().stop_multi_process_pool(  # type: ignore[attr-defined]
                self._pool
            )
            self._pool = None

    def encode(self, texts: list[str]) -> np.ndarray:
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        ordered = [texts[i] for i in order]
        if self._pool is not None:
            embedder = self.embedder
            vectors = np.asarray(
                embedder.library_model().encode(  # type: ignore[attr-defined]
                    ordered,
                    prompt=embedder.prefix or None,  # type: ignore[attr-defined]
                    batch_size=self.options.batch_size,
                    pool=self._pool,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                ),
                dtype=np.float32,
            )
        else:
            vectors = self.embedder.embed(ordered, batch_size=self.options.batch_size)
        out = np.empty((len(texts), vectors.shape[1]), dtype=np.float32)
        out[order] = vectors
        return out


def cached_keys_summary(cache: EmbeddingCache, configs: Iterable[FeatureConfig]) -> dict:
    """Sizes of a cache, for reports: vectors and windows indexed per feature config."""
    return {
        "embedder_id": cache.embedder_id,
        "folder": str(cache.folder),
        "vectors": len(cache.vectors),
        "windows_indexed": {c.fingerprint(): len(cache.text_index(c)) for c in configs},
    }
