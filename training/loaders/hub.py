"""Records from a Hugging Face hub dataset (`hf:<dataset id>[:split]`) through `datasets`.

Hub access is optional: when the hub cannot be reached (offline, a gated dataset without a
token, a wrong id) the load fails at once with `DatasetUnavailableError`, which names the
dataset and suggests loading a local copy instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from predictor.errors import InvalidInputError
from training.loaders.readers import RawRecord, RecordPosition
from training.loaders.report import DatasetUnavailableError

HUB_PREFIX = "hf:"
DEFAULT_SPLIT = "train"


def parse_hub_source(source: str) -> tuple[str, str]:
    """(dataset id, split) of `hf:<dataset id>[:split]`; the split defaults to `train`."""
    if not source.startswith(HUB_PREFIX):
        raise InvalidInputError(f"a hub source starts with {HUB_PREFIX!r}, got {source!r}")
    dataset_id, _, split = source[len(HUB_PREFIX) :].partition(":")
    if not dataset_id or "/" not in dataset_id:
        raise InvalidInputError(
            f"expected hf:<owner>/<dataset>[:split], e.g. hf:lmsys/lmsys-chat-1m:train; "
            f"got {source!r}"
        )
    return dataset_id, split or DEFAULT_SPLIT


def _unavailable(dataset_id: str, split: str, error: BaseException) -> DatasetUnavailableError:
    return DatasetUnavailableError(
        f"could not load dataset {dataset_id!r} (split {split!r}) from the Hugging Face hub "
        f"({type(error).__name__}: {error}). The hub may be unreachable from here, the dataset "
        "gated (lmsys/lmsys-chat-1m needs its licence accepted and an HF token) or the id or "
        "split wrong. Download it where the hub is reachable and load the local file or "
        "folder instead, e.g. load_conversations('data/lmsys-chat-1m/', format='lmsys')."
    )


def open_hub_dataset(dataset_id: str, split: str) -> Iterable[dict]:
    """The dataset as a stream of dicts (`streaming=True`: no full download for a `limit`)."""
    try:
        import datasets
    except ImportError as error:  # pragma: no cover - `datasets` is a project dependency
        raise _unavailable(dataset_id, split, error) from error
    try:
        return datasets.load_dataset(dataset_id, split=split, streaming=True)
    except Exception as error:  # any failure to reach or resolve the dataset means the same
        raise _unavailable(dataset_id, split, error) from error


def iter_hub_records(dataset: Iterable[dict], dataset_id: str, split: str) -> Iterator[RawRecord]:
    name = f"{HUB_PREFIX}{dataset_id}:{split}"
    rows = iter(dataset)
    index = 0
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except Exception as error:  # a stream that breaks mid-way (network) is unavailable too
            raise _unavailable(dataset_id, split, error) from error
        yield RawRecord(RecordPosition(name, index), row)
        index += 1
