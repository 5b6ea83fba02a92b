"""The data pipeline at WMT'14 En-Fr size (36M pairs): tokenization speed and how it scales
with cores, epoch-plan time and memory, a training host's peak RSS, restart to first batch.

    python bench/data_scale.py --json results.json
    python bench/data_scale.py --sizes 1M,4M,12M,36M --tokenize-pairs 200000
    python bench/data_scale.py --cache-dir /tmp/attnmt-36M   # keep the 36M cache for reruns
    python bench/data_scale.py --parts plan,restart --kinds packed --sizes 36M
    python bench/data_scale.py --smoke

Everything is synthetic, with WMT-like lengths: source tokens lognormal around 27 (mean
about 31), target about 1.1 times the source, EOS included, max_length 256; shapes from a
25k-token budget per side (bucket_shapes(256, 25000): 15 buckets) and, packed, 96 rows of
256 tokens.

Parts:
- tokenize: sentences drawn from a fixed made-up word list, a 8k sentencepiece vocabulary
  trained on a sample, then --tokenize-pairs pairs written into a token cache
  (attnmt.data.token_cache.load_or_write) with 1 worker and with one per core; seconds per
  million pairs and the speed-up.
- plan: what a run waits for before an epoch's first batch, at each size, in a fresh process:
  bucketed, plan_epoch (the whole epoch is planned at once); packed, the epoch's example
  order and its first batch (an epoch is packed batch by batch as it is drawn, on the
  training loop's prefetch thread), then the packing time per batch over the next
  --pack-batches batches (mean, 99th percentile and largest, µs). And the peak RSS this adds
  (VmHWM after minus VmRSS before, the peak reset in between: the lengths excluded).
- host: a training host at the largest size: a fresh process opens the cache (tokens written
  straight from synthetic arrays in the cache's format, no tokenizer), plans, and draws 50
  batches of its rows; its peak RSS (VmHWM).
- restart: a fresh process opens the same cache, restores an iterator state half-way through
  epoch 0 and draws one batch; the wall time from starting the process, and its parts.
  Packed, twice: from a state without packed_offset (as saved before it existed: the epoch
  is packed again up to it), then from the state that run saved (with it: no replay).
--parts and --kinds choose what runs (host and restart need no tokenizer: any part runs
alone). Goals (issue 29): peak RSS ≤ 4 GiB at 36M, plan ≤ 10 s, restart ≤ 30 s,
tokenization scaling with cores.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import common
import numpy as np

MAX_LENGTH = 256
TOKENS_PER_BATCH = 25_000
PACK_ROWS = TOKENS_PER_BATCH // MAX_LENGTH // 8 * 8  # 96 rows of 256 tokens
VOCAB_SIZE = 8000
HOST_BATCHES = 50
PARTS = ("tokenize", "plan", "host", "restart")
KINDS = ("bucketed", "packed")


def parse_size(text: str) -> int:
    """'36M' → 36_000_000, '200k' → 200_000, '5000' → 5000."""
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1].lower(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def synthetic_lengths(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) lengths with EOS, int32: lognormal around 27 tokens, target about
    1.1 × source (some exceed MAX_LENGTH, as some WMT pairs do)."""
    rng = np.random.default_rng(seed)
    src = np.rint(rng.lognormal(np.log(27), 0.55, count)).clip(1, 4 * MAX_LENGTH) + 1
    tgt = np.rint(src * rng.lognormal(np.log(1.1), 0.15, count)).clip(1, 4 * MAX_LENGTH) + 1
    return src.astype(np.int32), tgt.astype(np.int32)


def proc_status(field: str) -> int:
    """A memory field of /proc/self/status in bytes (Linux; 0 elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def vm_hwm_bytes() -> int:
    """This process's peak resident memory, memory-mapped file pages included."""
    return proc_status("VmHWM")


def reset_peak() -> None:
    """Makes VmHWM the current RSS (Linux), so that a later peak is the part's own, not the
    making of the lengths before it (float64 temporaries, larger than some plans)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


# --------------------------------------------------------------------------- tokenize


def cache_path(folder: Path | str) -> Any:
    """`folder` as the path type attnmt.data.token_cache takes (local or gs://)."""
    from attnmt.storage import as_path

    return as_path(str(folder), "token cache")


def _words(seed: int, count: int = 6000) -> list[str]:
    rng = np.random.default_rng(seed)
    syllables = [c + v for c in "bcdfglmnprstvz" for v in "aeiou"] + ["an", "er", "on", "ir"]
    return ["".join(rng.choice(syllables, size=rng.integers(1, 5))) for _ in range(count)]


def synthetic_pairs(count: int, seed: int) -> Iterator[tuple[str, str]]:
    """Sentence pairs of words from two fixed lists (Zipf-like frequencies), about 0.8
    words per token of synthetic_lengths."""
    rng = np.random.default_rng(seed)
    src_words, tgt_words = _words(1), _words(2)
    src_len, tgt_len = synthetic_lengths(count, seed)
    ranks = np.minimum(rng.zipf(1.2, size=int((src_len.sum() + tgt_len.sum()) * 0.8) + count), 6000)
    position = 0
    for s, t in zip(src_len, tgt_len, strict=True):
        ns, nt = max(1, int(s * 0.8)), max(1, int(t * 0.8))
        picks = ranks[position : position + ns + nt] - 1
        position += ns + nt
        yield (
            " ".join(src_words[i] for i in picks[:ns]),
            " ".join(tgt_words[i] for i in picks[ns:]),
        )


def tokenize_part(pairs: int, folder: Path) -> list[dict]:
    from attnmt.data import token_cache
    from attnmt.data.tokenizer import Tokenizer, train_vocab

    sample = list(itertools.islice(synthetic_pairs(20_000, seed=7), 20_000))
    model = train_vocab(itertools.chain.from_iterable(sample), folder / "spm.model", VOCAB_SIZE)
    tokenizer = Tokenizer.load(model)
    cores = len(os.sched_getaffinity(0))
    rows = []
    for workers in sorted({1, cores}):
        target = folder / f"tokenized-{workers}"
        layout = token_cache.Layout(workers=workers)
        start = time.perf_counter()
        _, stats = token_cache.load_or_write(
            cache_path(target),
            lambda: synthetic_pairs(pairs, seed=11),
            tokenizer,
            MAX_LENGTH,
            layout=layout,
        )
        seconds = time.perf_counter() - start
        rows.append(
            {
                "part": "tokenize",
                "pairs": pairs,
                "workers": workers,
                "seconds": seconds,
                "s_per_M_pairs": seconds / pairs * 1e6,
                "kept": stats.kept,
            }
        )
    for row in rows:
        row["speedup"] = rows[0]["seconds"] / row["seconds"]
    return rows


# --------------------------------------------------------------------------- a cache


def write_synthetic_cache(folder: Path, count: int, seed: int) -> float:
    """A token cache of `count` pairs in token_cache's format (its own shard and manifest
    writers), tokens drawn at random: no text, no tokenizer. Returns seconds taken."""
    from attnmt.data import token_cache
    from attnmt.data.pipeline import EncodedChunk

    start = time.perf_counter()
    per_shard = token_cache.DEFAULT_LAYOUT.pairs_per_shard
    dtypes = token_cache._dtypes(VOCAB_SIZE, MAX_LENGTH)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for shard, first in enumerate(range(0, count, per_shard)):
        total = min(per_shard, count - first)
        src, tgt = synthetic_lengths(total, seed + shard)
        keep = np.flatnonzero((src <= MAX_LENGTH) & (tgt <= MAX_LENGTH))
        sides = {}
        for name, lengths in (("src", src[keep]), ("tgt", tgt[keep])):
            tokens = rng.integers(4, VOCAB_SIZE, size=int(lengths.sum()), dtype=np.int32)
            tokens[np.cumsum(lengths) - 1] = 1  # EOS ends each example
            sides[name] = (tokens, lengths.astype(np.int64))
        chunk = EncodedChunk(
            *sides["src"], *sides["tgt"], keep + first, total, total - len(keep), 0
        )
        token_cache._write_shard(cache_path(folder), shard, [chunk], dtypes, 0)
    token_cache._write_manifest(cache_path(folder), count, per_shard, key="bench/data_scale.py")
    return time.perf_counter() - start


def ensure_cache(folder: Path, count: int) -> None:
    """Writes the synthetic cache of `count` pairs into `folder` unless one is complete."""
    from attnmt.data import token_cache

    if token_cache._complete(cache_path(folder)) is None:
        print(f"writing a {count:,}-pair token cache to {folder}", flush=True)
        seconds = write_synthetic_cache(folder, count, seed=3)
        print(f"  written in {seconds:.1f} s", flush=True)


# --------------------------------------------------------------------------- children


def _open_cache(folder: str) -> Any:
    from attnmt.data import token_cache

    # What load_or_write does with a complete cache (it needs a tokenizer only to write).
    corpus, _ = token_cache.open_cache(cache_path(folder))
    return corpus


def _shapes(kind: str) -> list[tuple[int, int]]:
    from attnmt.data.batching import bucket_shapes

    return [(PACK_ROWS, MAX_LENGTH)] if kind == "packed" else bucket_shapes(256, TOKENS_PER_BATCH)


def child_plan(job: dict) -> dict:
    from attnmt.data.batching import plan_epoch

    src, tgt = synthetic_lengths(job["pairs"], seed=0)
    reset_peak()
    before = proc_status("VmRSS")
    start = time.perf_counter()
    if job["kind"] == "packed":
        answer = _packed_epoch_start(src, tgt, job["pack_batches"])
    else:
        answer = {"batches": len(plan_epoch(src, tgt, _shapes("bucketed"), seed=1, epoch=0))}
        answer["seconds"] = time.perf_counter() - start
    return {**answer, "plan_peak": vm_hwm_bytes() - before}


def _packed_epoch_start(src: np.ndarray, tgt: np.ndarray, batches: int) -> dict:
    """What BatchIterator(pack=True) pays: the epoch's order and first batch (seconds),
    then each of the next `batches` batches (µs; fewer if the epoch ends first)."""
    from attnmt.data.packing import EpochPacker, epoch_order

    start = time.perf_counter()
    packer = EpochPacker(src, tgt, epoch_order(len(src), 1, 0), PACK_ROWS, MAX_LENGTH)
    next(packer)
    seconds = time.perf_counter() - start
    times = []
    for _ in range(batches):
        start = time.perf_counter()
        if next(packer, None) is None:
            break
        times.append(time.perf_counter() - start)
    micro = np.asarray(times) * 1e6
    return {
        "seconds": seconds,
        "batches_timed": len(times),
        "us_per_batch": float(micro.mean()) if len(micro) else None,
        "p99_us_per_batch": float(np.percentile(micro, 99)) if len(micro) else None,
        "max_us_per_batch": float(micro.max()) if len(micro) else None,
    }


def child_host(job: dict) -> dict:
    from attnmt.data.pipeline import BatchIterator

    times = {}
    start = time.perf_counter()
    corpus = _open_cache(job["cache"])
    times["open_s"] = time.perf_counter() - start
    packed = job["kind"] == "packed"
    batches = BatchIterator(corpus, _shapes(job["kind"]), seed=1, pack=packed)
    if job.get("state"):
        batches.set_state(job["state"])
    drawn = job.get("draw", HOST_BATCHES)
    next(batches)
    times["first_batch_s"] = time.perf_counter() - start
    for _ in range(drawn - 1):
        next(batches)
    times["all_batches_s"] = time.perf_counter() - start
    # VmHWM counts the cache's pages the kernel read (and may drop) for the memory maps;
    # RssAnon is the process's own memory.
    return {
        **times,
        "pairs": len(corpus),
        "drawn": drawn,
        "state": batches.get_state(),
        "peak_rss": vm_hwm_bytes(),
        "rss_anon": proc_status("RssAnon"),
        "rss_file": proc_status("RssFile"),
    }


def run_child(job: dict) -> dict:
    """`job` run by a fresh interpreter; its JSON answer, with the wall time of the whole
    process (interpreter start and imports included)."""
    start = time.perf_counter()
    command = [sys.executable, __file__, "--child", json.dumps(job)]
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"child {job} failed:\n{out.stderr[-3000:]}")
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    return {**answer, "process_s": time.perf_counter() - start}


# --------------------------------------------------------------------------- parts


def plan_part(sizes: list[int], kinds: list[str], pack_batches: int) -> list[dict]:
    rows = []
    for pairs, kind in itertools.product(sizes, kinds):
        job = {"part": "plan", "pairs": pairs, "kind": kind, "pack_batches": pack_batches}
        answer = run_child(job)
        rows.append({"part": "plan", "pairs": pairs, "kind": kind, **answer})
        per_batch = f", {answer['us_per_batch']:.0f} µs a batch" if kind == "packed" else ""
        print(
            f"  plan {kind:8s} {pairs:>11,} pairs: {answer['seconds']:.2f} s to the first "
            f"batch{per_batch}",
            flush=True,
        )
    return rows


def host_parts(folder: Path, count: int, parts: list[str], kinds: list[str]) -> list[dict]:
    rows = []
    for kind in kinds:
        job = {"part": "host", "cache": str(folder), "kind": kind}
        if "host" in parts:
            rows.append({"part": "host", "kind": kind, **run_child(job)})
        if "restart" in parts:
            rows += restart_rows(job, count)
    return rows


def restart_rows(job: dict, count: int) -> list[dict]:
    """Half-way through epoch 0 (about count / 2 pairs in, in batches of ~650 pairs): the
    state as saved before packed_offset existed; packed, then the state that run saved
    after its batch (with packed_offset), as a checkpoint holds it now."""
    state = {"epoch": 0, "index": count // 1300, "seed": 1}
    rows = []
    for saved in ("index", "packed_offset") if job["kind"] == "packed" else ("index",):
        answer = run_child({**job, "state": state, "draw": 1})
        rows.append({"part": "restart", "kind": job["kind"], "saved": saved, **answer})
        rows[-1]["index"] = state["index"]
        state = answer["state"]
        print(f"  restart {job['kind']} (by {saved}): {answer['process_s']:.1f} s", flush=True)
    return rows


def print_rows(rows: list[dict]) -> None:
    gib = 1 << 30
    for row in rows:
        for key in ("plan_peak", "peak_rss", "rss_anon", "rss_file"):
            if key in row:
                row[f"{key}_GiB"] = row[key] / gib
    for part, columns in (
        ("tokenize", ["pairs", "workers", "seconds", "s_per_M_pairs", "speedup"]),
        (
            "plan",
            [
                "pairs",
                "kind",
                "seconds",
                "batches",
                "batches_timed",
                "us_per_batch",
                "p99_us_per_batch",
                "max_us_per_batch",
                "plan_peak_GiB",
            ],
        ),
        (
            "host",
            [
                "kind",
                "pairs",
                "open_s",
                "first_batch_s",
                "all_batches_s",
                "peak_rss_GiB",
                "rss_anon_GiB",
            ],
        ),
        (
            "restart",
            [
                "kind",
                "saved",
                "index",
                "open_s",
                "first_batch_s",
                "process_s",
                "peak_rss_GiB",
                "rss_anon_GiB",
            ],
        ),
    ):
        chosen = [row for row in rows if row["part"] == part]
        if chosen:
            print(f"\n{part}\n" + common.markdown_table(chosen, columns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1M,4M,12M,36M", help="pairs per plan size")
    parser.add_argument("--tokenize-pairs", default="200k", help="pairs tokenized per run")
    parser.add_argument("--cache-dir", help="the largest size's token cache (kept; reused)")
    parser.add_argument("--parts", default=",".join(PARTS), help="of " + ",".join(PARTS))
    parser.add_argument("--kinds", default=",".join(KINDS), help="of " + ",".join(KINDS))
    parser.add_argument(
        "--pack-batches", type=int, default=2000, help="packed plan: batches timed one by one"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    common.add_output_args(parser)
    args = parser.parse_args()
    if args.child:
        job = json.loads(args.child)
        print(json.dumps((child_plan if job["part"] == "plan" else child_host)(job)))
        return
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    tokenize_pairs = parse_size(args.tokenize_pairs)
    parts, kinds = common.str_list(args.parts), common.str_list(args.kinds)
    unknown = sorted(set(parts) - set(PARTS)) + sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown parts or kinds: {', '.join(unknown)}")
    if args.smoke:
        sizes, tokenize_pairs = [20_000], 5_000
    info = common.machine_info()
    common.print_machine(info)
    common.warn_if_busy(info)
    rows = []
    with tempfile.TemporaryDirectory(prefix="attnmt-data-scale-") as scratch:
        if "tokenize" in parts:
            print(f"tokenizing {tokenize_pairs:,} pairs with 1 and all workers", flush=True)
            rows += tokenize_part(tokenize_pairs, Path(scratch))
        if "plan" in parts:
            rows += plan_part(sizes, kinds, args.pack_batches)
        if {"host", "restart"} & set(parts):
            folder = Path(args.cache_dir or Path(scratch) / "cache")
            ensure_cache(folder, sizes[-1])
            rows += host_parts(folder, sizes[-1], parts, kinds)
    print_rows(rows)
    common.append_json(args.json, "data_scale", args, rows)


if __name__ == "__main__":
    main()
