"""Measure on a GPU the figures the two-tier replay's latency model assumes.

    python scripts/measure_tier_latency.py [--out FILE] [--json]
    python scripts/measure_tier_latency.py --model tiny --device cpu --lengths 64,128,256,512

The TTFT model of `lpc ab --offload-sizes` (`lpc.replay.latency.TierLatency`) prices a miss at
a prefill's time (per token and per pair of tokens) and a host hit at a host→device
bandwidth; its defaults are this script's figures on one H100 (docs/results.md, "The latency
model, measured"). It measures both on the GPU it runs on, for Qwen3-8B's shape with random
bfloat16 weights (the timing does not depend on them):

- **prefill**: one forward pass of L tokens through `transformers`' Qwen3 (`sdpa` attention,
  no KV kept, logits of the last token only), for L from 512 to 131,072 tokens, best of
  `--repeats`; then T(L) = c + a·L + b·L² fitted (`lpc.replay.latency_calibration`), and a
  few prefills of n tokens after k cached ones to check that they cost T(k+n) − T(k).
  `transformers` runs unfused element-wise kernels where an engine fuses them, so an engine's
  prefill is at most this slow;
- **host→device copy** of a hit of `--hit-tokens` tokens of KV from pinned host memory: one
  bulk copy (the bus's ceiling), and the copy vLLM's CPU tier makes, one copy per GPU page
  (one layer's K or V of one 16-token block, 32 KB for Qwen3-8B) from scattered host pages to
  scattered device pages, issued from Python, captured in one CUDA graph (the driver's
  per-copy cost without Python's), and in one `cuMemcpyBatchAsync` call (CUDA ≥ 12.8), as
  vLLM 0.33 issues them for pages of 28 KB and more.

Writes one JSON document (`--out`, and stdout with `--json`), rewritten after each stage so
that a run cut short keeps what it measured. `--model tiny --device cpu` runs the prefill
stage on a two-layer model (the tests use it; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from lpc.replay.latency import QWEN3_8B, KVShape, TierLatency
from lpc.replay.latency_calibration import copy_bandwidth, fit_prefill
from predictor.atomic_files import write_text_atomically

QWEN3_8B_CONFIG: dict[str, Any] = {
    "vocab_size": 151_936,
    "hidden_size": 4096,
    "intermediate_size": 12_288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 131_072,
    "tie_word_embeddings": False,
}
TINY_CONFIG: dict[str, Any] = {
    "vocab_size": 1024,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
MODELS = {"qwen3-8b": QWEN3_8B_CONFIG, "tiny": TINY_CONFIG}
DEFAULT_LENGTHS = "512,1024,2048,4096,8192,16384,32768,65536,131072"
DEFAULT_SUFFIXES = "8192:1024,16384:4096,32768:2048"


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise SystemExit(f"{flag}: expected positive integers, got {text!r}")
    return values


def _suffixes(text: str) -> list[tuple[int, int]]:
    pairs = []
    for item in (v for v in text.split(",") if v.strip()):
        cached, _, new = item.partition(":")
        try:
            pair = (int(cached), int(new))
        except ValueError:
            raise SystemExit(
                f"--suffixes: expected CACHED:NEW pairs such as 16384:4096, got {item!r}"
            ) from None
        if pair[0] <= 0 or pair[1] <= 0:
            raise SystemExit(f"--suffixes: both counts must be positive, got {item!r}")
        pairs.append(pair)
    return pairs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen3-8b")
    parser.add_argument("--device", default="cuda", help="torch device (default: %(default)s)")
    parser.add_argument("--lengths", default=DEFAULT_LENGTHS, help="prefill lengths in tokens")
    parser.add_argument(
        "--suffixes",
        default=DEFAULT_SUFFIXES,
        help="CACHED:NEW prefills to check against the fit ('' for none)",
    )
    parser.add_argument("--repeats", type=int, default=2, help="timings per length (best kept)")
    parser.add_argument("--hit-tokens", type=int, default=10_240, help="tokens of KV copied")
    parser.add_argument("--block-tokens", type=int, default=16, help="tokens per GPU block")
    parser.add_argument("--skip-copy", action="store_true", help="prefill stage only")
    parser.add_argument("--skip-prefill", action="store_true", help="copy stage only")
    parser.add_argument("--out", type=Path, help="write the JSON document here")
    parser.add_argument("--json", action="store_true", help="print the JSON document")
    args = parser.parse_args(argv)
    args.length_list = sorted(set(_int_list(args.lengths, "--lengths")))
    args.suffix_list = _suffixes(args.suffixes)
    for name in ("repeats", "hit_tokens", "block_tokens"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.hit_tokens % args.block_tokens:
        parser.error("--hit-tokens must be a multiple of --block-tokens")
    return args


def kv_shape(config: dict[str, Any], name: str) -> KVShape:
    return KVShape(
        name,
        num_layers=config["num_hidden_layers"],
        num_kv_heads=config["num_key_value_heads"],
        head_dim=config["head_dim"],
        dtype_bytes=2,
    )


class Clock:
    """Wall-clock seconds of a callable, the device synchronised before and after."""

    def __init__(self, torch: Any, device: Any) -> None:
        self._torch = torch
        self._cuda = device.type == "cuda"

    def sync(self) -> None:
        if self._cuda:
            self._torch.cuda.synchronize()

    def time(self, fn: Callable[[], Any]) -> float:
        self.sync()
        start = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - start


def build_model(torch: Any, config: dict[str, Any], device: Any) -> Any:
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(
            Qwen3Config(**config), attn_implementation="sdpa", dtype=torch.bfloat16
        )
    return model.eval()


def measure_prefill(torch: Any, args: argparse.Namespace, report: dict[str, Any], save) -> None:
    """Time cold prefills at each length, fit T(L), then check cached-prefix prefills."""
    config = MODELS[args.model]
    device = torch.device(args.device)
    clock = Clock(torch, device)
    started = time.perf_counter()
    model = build_model(torch, config, device)
    register_lower_right_attention(torch)
    report["prefill"] = {
        "implementation": "transformers Qwen3ForCausalLM, sdpa attention, bfloat16, random weights",
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "build_s": round(time.perf_counter() - started, 2),
        "lengths": [],
    }
    vocab = config["vocab_size"]
    generator = torch.Generator(device="cpu").manual_seed(1)

    def ids(n: int) -> Any:
        return torch.randint(0, vocab, (1, n), generator=generator).to(device)

    with torch.inference_mode():
        warm = ids(min(args.length_list[0], 2048))
        for _ in range(2):
            clock.time(partial(model, input_ids=warm, use_cache=False, logits_to_keep=1))
        for length in args.length_list:
            tokens = ids(length)
            row: dict[str, Any] = {"tokens": length}
            try:
                times = [
                    clock.time(partial(model, input_ids=tokens, use_cache=False, logits_to_keep=1))
                    for _ in range(args.repeats)
                ]
            except torch.OutOfMemoryError as error:  # the longest lengths may not fit
                row["error"] = str(error).splitlines()[0]
                report["prefill"]["lengths"].append(row)
                torch.cuda.empty_cache()
                save()
                break
            row.update(seconds=min(times), all_seconds=times, tokens_per_s=length / min(times))
            report["prefill"]["lengths"].append(row)
            print(f"prefill {length:>7} tokens: {min(times) * 1e3:9.1f} ms", file=sys.stderr)
            save()
        measured = [r for r in report["prefill"]["lengths"] if "seconds" in r]
        if len({r["tokens"] for r in measured}) >= 3:
            fit = fit_prefill([r["tokens"] for r in measured], [r["seconds"] for r in measured])
            report["prefill"]["fit"] = fit.to_dict()
            save()
            report["prefill"]["suffixes"] = [
                _suffix_row(torch, model, clock, ids, cached, new, args.repeats, fit)
                for cached, new in args.suffix_list
            ]
            save()
    model.to("meta")  # frees the weights before the next stage
    if device.type == "cuda":
        torch.cuda.empty_cache()


LOWER_RIGHT = "lpc_sdpa_lower_right"


def register_lower_right_attention(torch: Any) -> None:
    """An attention for `transformers` that aligns the causal mask at the bottom right, as an
    engine's prefill after a cached prefix does, through PyTorch's `causal_lower_right` bias:
    SDPA then runs its flash (or memory-efficient) kernel with no mask tensor, where
    `transformers`' own `sdpa` hands it an explicit mask whenever the query is shorter than
    the keys. K and V are repeated to the query heads, as `transformers`' `repeat_kv` does."""
    from torch.nn.attention.bias import causal_lower_right
    from transformers import AttentionInterface

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **_):
        groups = query.shape[1] // key.shape[1]
        if groups > 1:
            key = key.repeat_interleave(groups, dim=1)
            value = value.repeat_interleave(groups, dim=1)
        bias = causal_lower_right(query.shape[2], key.shape[2])
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=bias, scale=scaling
        )
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register(LOWER_RIGHT, attention)


def _timed_suffix(model, clock, tokens, cached: int, new: int, cache, repeats: int):
    """Best time of prefilling tokens[cached:] after the cached prefix, and the last logits."""
    times, logits = [], None
    for _ in range(repeats):
        out = {}

        def step(out: dict = out) -> None:
            out["logits"] = model(
                input_ids=tokens[:, cached:],
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            ).logits

        times.append(clock.time(step))
        logits = out["logits"]
        cache.crop(-new)  # back to the prefix (a negative count drops tokens)
    return min(times), logits


def _suffix_row(torch, model, clock, ids, cached: int, new: int, repeats: int, fit) -> dict:
    """Prefill `new` tokens after `cached` tokens kept in a DynamicCache, with `transformers`'
    `sdpa` and with the bottom-right causal attention, against the fit."""
    row: dict[str, Any] = {"cached_tokens": cached, "new_tokens": new}
    try:
        tokens = ids(cached + new)
        prefix = model(input_ids=tokens[:, :cached], use_cache=True, logits_to_keep=1)
        cache = prefix.past_key_values
        seconds, logits = _timed_suffix(model, clock, tokens, cached, new, cache, repeats)
        modelled = fit.intercept_s + fit.suffix_seconds(cached, new)
        row.update(
            seconds=seconds,
            fit_seconds=modelled,
            fit_relative_error=(modelled - seconds) / seconds,
            linear_default_seconds=new / TierLatency().prefill_tokens_per_s,
        )
        model.set_attn_implementation(LOWER_RIGHT)
        try:
            lower, lower_logits = _timed_suffix(model, clock, tokens, cached, new, cache, repeats)
        finally:
            model.set_attn_implementation("sdpa")
        row.update(
            lower_right_seconds=lower,
            lower_right_fit_relative_error=(modelled - lower) / lower,
            lower_right_logits_max_abs_diff=float((lower_logits - logits).abs().max()),
        )
        print(
            f"suffix {cached}+{new}: {seconds * 1e3:.1f} ms, bottom-right "
            f"{lower * 1e3:.1f} ms (fit {modelled * 1e3:.1f})",
            file=sys.stderr,
        )
    except Exception as error:  # a failed check is reported, the other figures are kept
        row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return row


def measure_copy(torch: Any, args: argparse.Namespace, shape: KVShape, report: dict, save) -> None:
    """Copy a hit's KV from pinned host memory to the GPU: in bulk, then page by page."""
    device = torch.device(args.device)
    if device.type != "cuda":
        report["copy"] = {"skipped": "host→device copies are measured on a CUDA device only"}
        save()
        return
    clock = Clock(torch, device)
    total = args.hit_tokens * shape.bytes_per_token
    page = args.block_tokens * shape.num_kv_heads * shape.head_dim * shape.dtype_bytes
    pages = total // page
    copy: dict[str, Any] = {
        "hit_tokens": args.hit_tokens,
        "bytes": total,
        "page_bytes": page,
        "pages": pages,
        "page_is": "one layer's K or V of one block",
    }
    report["copy"] = copy
    stream = torch.cuda.Stream()

    def record(name: str, fn: Callable[[], Any], rounds: int) -> None:
        """One warm-up, then `rounds` timings of copying the hit; the best gives GB/s."""
        try:
            fn()
            times = [clock.time(fn) for _ in range(rounds)]
            copy[f"{name}_gb_per_s"] = copy_bandwidth(total, times) / 1e9
            copy[f"{name}_seconds"] = times
        except Exception as error:  # a refused way of copying is reported, the rest kept
            copy[f"{name}_error"] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
        save()

    record("bulk", _bulk_copy(torch, total, device, stream), 5)
    # Scattered pages: the tier's pages sit anywhere in a pool twice the hit's size, the GPU's
    # free blocks anywhere in its pool.
    rng = np.random.default_rng(0)
    host_pool = torch.empty((2 * pages, page), dtype=torch.uint8, pin_memory=True)
    dev_pool = torch.empty((pages, page), dtype=torch.uint8, device=device)
    sources = rng.choice(2 * pages, size=pages, replace=False).tolist()
    targets = rng.permutation(pages).tolist()
    rows = list(zip([dev_pool[i] for i in targets], [host_pool[i] for i in sources], strict=True))

    def paged() -> None:
        with torch.cuda.stream(stream):
            for dst, src in rows:
                dst.copy_(src, non_blocking=True)

    record("paged_eager", paged, 3)

    def graphed() -> Callable[[], Any]:
        """The page copies captured in one CUDA graph (capture may be refused)."""
        graph = torch.cuda.CUDAGraph()
        started = time.perf_counter()
        with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
            for dst, src in rows:
                dst.copy_(src, non_blocking=True)
        copy["paged_graph_capture_s"] = time.perf_counter() - started
        return graph.replay

    try:
        record("paged_graph", graphed(), 5)
    except Exception as error:  # capture of host copies may be refused: say so, keep the rest
        copy["paged_graph_error"] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
        save()
    try:
        batch = BatchedCopy(host_pool, dev_pool, sources, targets, page, stream.cuda_stream)
    except (OSError, AttributeError) as error:  # no driver library, or one without the call
        copy["paged_batch_error"] = f"{type(error).__name__}: {error}"
        save()
        return
    copy["paged_batch_api"] = batch.symbol
    record("paged_batch", batch, 5)
    copy["paged_batch_correct"] = bool(
        torch.equal(dev_pool[targets[:64]].cpu(), host_pool[sources[:64]])
    )
    save()


def _bulk_copy(torch: Any, total: int, device: Any, stream: Any) -> Callable[[], None]:
    """One copy of `total` bytes from pinned host memory: the bus's ceiling."""
    host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    host.fill_(1)
    dev = torch.empty(total, dtype=torch.uint8, device=device)

    def bulk() -> None:
        with torch.cuda.stream(stream):
            dev.copy_(host, non_blocking=True)

    return bulk


class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _MemcpyAttributes(ctypes.Structure):
    _fields_ = [
        ("srcAccessOrder", ctypes.c_int),
        ("srcLocHint", _MemLocation),
        ("dstLocHint", _MemLocation),
        ("flags", ctypes.c_uint),
    ]


class BatchedCopy:
    """All pages in one `cuMemcpyBatchAsync` call of the CUDA driver (CUDA ≥ 12.8), the call
    vLLM's CPU tier makes for pages of 28 KB and more: one descriptor per page, no launch each."""

    _STREAM_ORDER = 1  # CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    _HOST, _DEVICE = 2, 1  # CU_MEM_LOCATION_TYPE_HOST, _DEVICE

    def __init__(self, host_pool, dev_pool, sources, targets, page: int, stream: int) -> None:
        driver = ctypes.CDLL("libcuda.so.1")
        n = len(sources)
        self._count = n
        self._dsts = (ctypes.c_uint64 * n)(*(dev_pool.data_ptr() + t * page for t in targets))
        self._srcs = (ctypes.c_uint64 * n)(*(host_pool.data_ptr() + s * page for s in sources))
        self._sizes = (ctypes.c_size_t * n)(*([page] * n))
        self._attrs = (_MemcpyAttributes * 1)(
            _MemcpyAttributes(
                self._STREAM_ORDER, _MemLocation(self._HOST, 0), _MemLocation(self._DEVICE, 0), 0
            )
        )
        self._attr_idx = (ctypes.c_size_t * 1)(0)
        self._fail_idx = ctypes.c_size_t(0)
        self._stream = ctypes.c_void_p(stream)
        try:  # CUDA 13's signature (no failIdx)
            self._fn = driver.cuMemcpyBatchAsync_v2
            self.symbol = "cuMemcpyBatchAsync_v2"
            self._legacy = False
        except AttributeError:  # CUDA 12.8–12.9's, with failIdx
            self._fn = driver.cuMemcpyBatchAsync
            self.symbol = "cuMemcpyBatchAsync"
            self._legacy = True

    def __call__(self) -> None:
        head = (
            self._dsts,
            self._srcs,
            self._sizes,
            ctypes.c_size_t(self._count),
            self._attrs,
            self._attr_idx,
            ctypes.c_size_t(1),
        )
        if self._legacy:
            result = self._fn(*head, ctypes.byref(self._fail_idx), self._stream)
        else:
            result = self._fn(*head, self._stream)
        if result != 0:
            raise RuntimeError(f"{self.symbol} returned CUresult {result}")


def environment(torch: Any, device: str) -> dict[str, Any]:
    import transformers

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": device,
    }
    if torch.device(device).type == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
    return env


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device (use --device cpu with tiny)")
    shape = kv_shape(MODELS[args.model], args.model)
    if args.model == "qwen3-8b" and shape.bytes_per_token != QWEN3_8B.bytes_per_token:
        raise SystemExit("the Qwen3-8B config here and lpc.replay.latency.QWEN3_8B disagree")
    report: dict[str, Any] = {
        "model": args.model,
        "kv_bytes_per_token": shape.bytes_per_token,
        "environment": environment(torch, args.device),
        "assumed": TierLatency().to_dict(),
    }

    def save() -> None:
        if args.out:
            write_text_atomically(args.out, json.dumps(report, indent=2) + "\n")

    save()
    if not args.skip_copy:
        measure_copy(torch, args, shape, report, save)
    if not args.skip_prefill:
        measure_prefill(torch, args, report, save)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(summary(report))
    return 0


def summary(report: dict[str, Any]) -> str:
    lines = [
        f"{report['model']} on {report['environment'].get('gpu', report['environment']['device'])}"
    ]
    for row in report.get("prefill", {}).get("lengths", []):
        if "seconds" in row:
            lines.append(
                f"  prefill {row['tokens']:>7} tokens  {row['seconds'] * 1e3:9.1f} ms"
                f"  {row['tokens_per_s']:9.0f} tokens/s"
            )
        else:
            lines.append(f"  prefill {row['tokens']:>7} tokens  {row['error']}")
    fit = report.get("prefill", {}).get("fit")
    if fit:
        lines.append(
            f"  fit: T(L) = {fit['intercept_s'] * 1e3:.2f} ms + {fit['s_per_token'] * 1e6:.2f} µs·L"
            f" + {fit['s_per_token_pair'] * 1e9:.4f} ns·L²"
            f"  (max error {fit['max_relative_error']:.1%})"
        )
    copy = report.get("copy", {})
    for key in (
        "bulk_gb_per_s",
        "paged_eager_gb_per_s",
        "paged_graph_gb_per_s",
        "paged_batch_gb_per_s",
    ):
        if key in copy:
            lines.append(f"  copy {key[:-9]:<12} {copy[key]:6.1f} GB/s")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
