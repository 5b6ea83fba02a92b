"""A tokenized corpus written once, in shards, by every process together, and read through
memory maps: at WMT'14 En-Fr scale (36M pairs) no host re-tokenizes or holds all of it.

A cache is one folder per key (everything that changes the tokens: attnmt.data.prepare).
Shard k holds pairs ``[k·R, (k+1)·R)`` of the split (R = ``Layout.pairs_per_shard``), as
``.npy`` files a reader can ``np.load(mmap_mode="r")``::

    shard-00003.src_tokens.npy      the kept pairs' source tokens end to end, EOS each
    shard-00003.tgt_tokens.npy      (uint16 when the vocabulary fits, else int32)
    shard-00003.src_lengths.npy     each kept pair's length, EOS included (uint16 / int32)
    shard-00003.tgt_lengths.npy
    shard-00003.source_indices.npy  each kept pair's position in the split (int64)
    shard-00003.json                its filter counts and its files' sizes (written last)
    manifest.json                   written LAST: every shard with every file's size

The manifest is the commit marker: a cache is used only when it is there and every file
it names has its recorded size; otherwise the shards are written again (a run killed
while writing leaves no error behind). Every file is written atomically (temporary file
and rename; on gs:// an object appears only once its upload is complete), and the bytes
depend only on the pairs, the vocabulary and max_length, never on the number of writers
or workers, so two runs writing one cache at once write the same bytes.

Writing: with P processes, process p tokenizes and writes shards p, p+P, p+2P, … (round
robin: a shard's cost is what a process waits for, so every process gets nearly the same
work), using every local core through a pool of sentencepiece workers started with
'spawn' (the parent's JAX runtime is never forked; the workers import no JAX). Every
process streams the source text (attnmt.data.sources.iter_pairs) and skips the shards
that are not its own, so none holds the corpus. The others wait at a barrier until
process 0 has written the manifest.

Reading (`TokenizedCorpus.from_shards`): the lengths and offsets are in RAM (int32 per
side and int64 per side: 24 bytes per pair, 0.86 GB at 36M pairs), the tokens stay in the
memory-mapped files and a host touches only the pages of the rows it gathers. A gs://
cache is first copied to a local folder ($ATTNMT_TOKEN_CACHE_LOCAL, default
~/.cache/attnmt/token-cache), then memory-mapped there.

$ATTNMT_TOKEN_CACHE_DEBUG=<folder> (tests): each shard write appends "<shard> <process>"
to ``writes.log`` there, and each gather appends the example ids to ``gathered-<p>.jsonl``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import math
import mmap
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path as LocalPath
from typing import IO, Any, Protocol

import numpy as np
import sentencepiece as spm

from attnmt.data.packing import PackedBatch
from attnmt.data.pair_tokenizer import PairTokenizer
from attnmt.data.pipeline import EncodedChunk, FilterStats, FlatTokens, TokenizedCorpus
from attnmt.data.pipeline import encode_chunk as _encode
from attnmt.data.tokenizer import Tokenizer
from attnmt.errors import DataError
from attnmt.storage import Path, as_path, is_remote, write_atomic, write_bytes_atomic

log = logging.getLogger(__name__)

FORMAT = 1
MANIFEST = "manifest.json"
DEBUG_ENV = "ATTNMT_TOKEN_CACHE_DEBUG"
LOCAL_ENV = "ATTNMT_TOKEN_CACHE_LOCAL"
ARRAYS = ("src_tokens", "tgt_tokens", "src_lengths", "tgt_lengths", "source_indices")
Pair = tuple[str, str]


@dataclasses.dataclass(frozen=True)
class Processes:
    """This process among the job's (`barrier(name)` returns once all have called it)."""

    index: int = 0
    count: int = 1
    barrier: Callable[[str], None] | None = None

    def wait(self, name: str) -> None:
        if self.count > 1 and self.barrier is not None:
            self.barrier(name)


@dataclasses.dataclass(frozen=True)
class Layout:
    """How the corpus is cut: the shard size is in the cache's layout (its manifest); the
    chunk size and worker count change only the speed."""

    pairs_per_shard: int = 1 << 18  # 138 shards at 36M pairs: even work for many hosts
    chunk_pairs: int = 8192  # pairs per task of a worker
    workers: int = 0  # tokenizing processes on this host; 0: one per core


ONE_PROCESS = Processes()
DEFAULT_LAYOUT = Layout()


def shard_name(shard: int) -> str:
    return f"shard-{shard:05d}"


def load_or_write(
    folder: Path,
    pairs: Callable[[], Iterable[Pair]],
    tokenizer: Tokenizer | PairTokenizer,
    max_length: int,
    *,
    key: str = "",
    processes: Processes = ONE_PROCESS,
    layout: Layout = DEFAULT_LAYOUT,
) -> tuple[TokenizedCorpus, FilterStats]:
    """The cache in `folder`, written first (each process its shards of `pairs()`) unless a
    complete one is there; every process of the job must call this together."""
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2 (a token and EOS), got {max_length}")
    folder = as_path(folder)  # a pathlib.Path's stat() has no `length`: take any path
    total = None
    reused = _complete(folder) is not None
    if not reused:
        i, count = processes.index, processes.count
        log.info(
            "tokenizing into %s: process %d of %d writes shards %d, %d, %d, …",
            folder, i, count, i, i + count, i + 2 * count,
        )  # fmt: skip
        dtypes = _dtypes(tokenizer.vocab_size, max_length)
        total = _write_own_shards(folder, pairs(), tokenizer, max_length, processes, layout, dtypes)
    processes.wait("attnmt token cache: shards written")
    if processes.index == 0 and _complete(folder) is None:
        if total is None:
            raise DataError(f"{folder}: the token cache was removed while in use")
        _write_manifest(folder, total, layout.pairs_per_shard, key)
    processes.wait("attnmt token cache: manifest written")
    manifest = _complete(folder)
    if manifest is None:
        raise DataError(f"{folder}: the token cache is incomplete right after writing it")
    stats = FilterStats(**manifest["stats"])
    if reused:
        log.info(
            "reusing the token cache %s (tokenized nothing): %d of %d pairs in %d shards",
            folder, stats.kept, stats.total, len(manifest["shards"]),
        )  # fmt: skip
    return _open(folder, manifest, processes.index), stats


def open_cache(folder: Path, process: int = 0) -> tuple[CachedCorpus, FilterStats]:
    """A complete cache, read (DataError if `folder` holds none); `process` names its
    gather record under $ATTNMT_TOKEN_CACHE_DEBUG."""
    folder = as_path(folder)
    manifest = _complete(folder)
    if manifest is None:
        raise DataError(
            f"{folder}: no complete token cache (no {MANIFEST}, or a shard is cut short)"
        )
    return _open(folder, manifest, process), FilterStats(**manifest["stats"])


def _dtypes(vocab_size: int, max_length: int) -> dict[str, np.dtype]:
    small = np.dtype(np.uint16)
    tokens = small if vocab_size <= np.iinfo(small).max + 1 else np.dtype(np.int32)
    lengths = small if max_length <= np.iinfo(small).max else np.dtype(np.int32)
    return {
        "src_tokens": tokens,
        "tgt_tokens": tokens,
        "src_lengths": lengths,
        "tgt_lengths": lengths,
        "source_indices": np.dtype(np.int64),
    }


# ---------------------------------------------------------------------------- writing


class _Reading:
    """How many pairs of the source have been read so far."""

    pairs = 0


def _own_chunks(
    pairs: Iterable[Pair], layout: Layout, processes: Processes, reading: _Reading
) -> Iterator[tuple[int, int, list[Pair]]]:
    """(shard, index of its first pair, pairs) of every chunk of this process's shards;
    the other shards' pairs are read and dropped (counted in `reading`)."""
    it, size = iter(pairs), layout.pairs_per_shard
    while True:
        shard = reading.pairs // size
        take = min(layout.chunk_pairs, (shard + 1) * size - reading.pairs)
        first = reading.pairs
        if shard % processes.count == processes.index:
            chunk = list(itertools.islice(it, take))
            reading.pairs += len(chunk)
            if not chunk:
                return
            yield shard, first, chunk
        else:
            skipped = sum(1 for _ in itertools.islice(it, take))
            reading.pairs += skipped
            if not skipped:
                return


class _Result(Protocol):
    def get(self) -> EncodedChunk: ...


@dataclasses.dataclass(frozen=True)
class _Done:
    value: EncodedChunk

    def get(self) -> EncodedChunk:
        return self.value


_worker_tokenizer: Tokenizer | PairTokenizer | None = None


def _start_worker(spec: tuple) -> None:
    global _worker_tokenizer
    if spec[0] == "pair":
        _worker_tokenizer = PairTokenizer(spec[1], spec[2])
    else:
        # One thread: the pool has one worker per core already.
        _worker_tokenizer = Tokenizer(spm.SentencePieceProcessor(model_proto=spec[1]), threads=1)


def _encode_in_worker(chunk: list[Pair], max_length: int, first: int) -> EncodedChunk:
    assert _worker_tokenizer is not None
    return _encode(chunk, _worker_tokenizer, max_length, first)


def _worker_spec(tokenizer: Tokenizer | PairTokenizer) -> tuple | None:
    """What a worker builds the same tokenizer from (None: this one has no file)."""
    if isinstance(tokenizer, PairTokenizer):
        return ("pair", str(tokenizer.path.parent), tokenizer.bos_id)
    if tokenizer.path is None:
        return None
    return ("sentencepiece", as_path(tokenizer.path).read_bytes())


class _Encoder:
    """Tokenizes chunks here (the first, and all with one worker) or in a pool of spawned
    workers started at the second chunk, so a small corpus starts no process."""

    def __init__(self, tokenizer: Tokenizer | PairTokenizer, max_length: int, workers: int):
        self.tokenizer, self.max_length = tokenizer, max_length
        self.workers = workers or len(os.sched_getaffinity(0))
        if self.workers == 1 and isinstance(tokenizer, Tokenizer):
            # One worker means one core (sentencepiece's batches would use them all).
            self.tokenizer = tokenizer.single_threaded()
        self.spec = _worker_spec(tokenizer) if self.workers > 1 else None
        self.pool: Any = None
        self.submitted = 0

    def submit(self, chunk: list[Pair], first: int) -> _Result:
        self.submitted += 1
        if self.spec is None or self.submitted == 1:
            return _Done(_encode(chunk, self.tokenizer, self.max_length, first))
        if self.pool is None:
            with _main_hidden():
                context = multiprocessing.get_context("spawn")
                self.pool = context.Pool(self.workers, _start_worker, (self.spec,))
        return self.pool.apply_async(_encode_in_worker, (chunk, self.max_length, first))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


_MAIN_LOCK = threading.Lock()


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """Spawned workers run the parent's main module again unless it is hidden: an
    unguarded script would start itself (and the CLI would import JAX) in every worker.
    The workers need only this module, which they import by name."""
    with _MAIN_LOCK:  # two writers in one process (threads) must not interleave the swap
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            sys.modules["__main__"] = main


def _encoded_shards(
    chunks: Iterator[tuple[int, int, list[Pair]]], encoder: _Encoder
) -> Iterator[tuple[int, list[EncodedChunk]]]:
    """(shard, its encoded chunks in order) for each shard of `chunks`; at most two chunks
    per worker are in flight, so memory stays bounded whatever the corpus size."""
    pending: collections.deque[tuple[int, _Result]] = collections.deque()
    window = 2 * encoder.workers
    current, parts = -1, []
    for item in itertools.chain(chunks, [None]):
        if item is not None:
            shard, first, chunk = item
            pending.append((shard, encoder.submit(chunk, first)))
        while pending and (item is None or len(pending) >= window):
            shard, result = pending.popleft()
            if shard != current and parts:
                yield current, parts
                parts = []
            current = shard
            parts.append(result.get())
    if parts:
        yield current, parts


def _write_own_shards(
    folder: Path,
    pairs: Iterable[Pair],
    tokenizer: Tokenizer | PairTokenizer,
    max_length: int,
    processes: Processes,
    layout: Layout,
    dtypes: dict[str, np.dtype],
) -> int:
    """Writes this process's shards; returns the number of pairs in the whole split."""
    reading = _Reading()
    encoder = _Encoder(tokenizer, max_length, layout.workers)
    chunks = _own_chunks(pairs, layout, processes, reading)
    try:
        with _progress(processes.index == 0) as advance:
            for shard, parts in _encoded_shards(chunks, encoder):
                _write_shard(folder, shard, parts, dtypes, processes.index)
                advance(reading.pairs)
    finally:
        encoder.close()
    return reading.pairs


@contextlib.contextmanager
def _progress(show: bool) -> Iterator[Callable[[int], None]]:
    """A console counter of the pairs read (process 0, on a terminal only)."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("[bold]tokenize[/] {task.completed:,} pairs read"))
    with Progress(*columns, TimeElapsedColumn(), disable=not (show and sys.stderr.isatty())) as bar:
        task = bar.add_task("tokenize", total=None)
        yield lambda pairs: bar.update(task, completed=pairs)


def _write_shard(
    folder: Path, shard: int, parts: list[EncodedChunk], dtypes: dict[str, np.dtype], writer: int
) -> None:
    """The shard's arrays, then its .json (sizes and counts) last."""
    sizes = {}
    for name in ARRAYS:
        array = np.concatenate([getattr(part, name) for part in parts]).astype(dtypes[name])
        sizes[name] = _save_npy(folder / f"{shard_name(shard)}.{name}.npy", array)
    meta = {
        "pairs": sum(part.total for part in parts),
        "kept": sum(len(part.src_lengths) for part in parts),
        "too_long": sum(part.too_long for part in parts),
        "empty": sum(part.empty for part in parts),
        "files": sizes,
    }
    write_bytes_atomic(folder / f"{shard_name(shard)}.json", json.dumps(meta).encode())
    _debug_append("writes.log", f"{shard} {writer}\n")


def _save_npy(path: Path, array: np.ndarray) -> int:
    """Writes `array` as a .npy file atomically; returns the file's size."""
    size = 0

    def write(file: IO[bytes]) -> None:
        nonlocal size
        np.save(file, array, allow_pickle=False)
        size = file.tell()

    write_atomic(path, write)
    return size


def _debug_append(name: str, text: str) -> None:
    folder = os.environ.get(DEBUG_ENV)
    if folder:
        with open(os.path.join(folder, name), "a") as file:  # one write: O_APPEND keeps lines whole
            file.write(text)


def _write_manifest(folder: Path, total: int, pairs_per_shard: int, key: str) -> None:
    """The manifest, from the shards' .json files (process 0, once all are written)."""
    shards = []
    for shard in range(math.ceil(total / pairs_per_shard)):
        path = folder / f"{shard_name(shard)}.json"
        if not path.exists():
            raise DataError(f"{path}: missing; a process did not write its token cache shard")
        shards.append(json.loads(path.read_text()))
    stats = {
        name: sum(shard[name] for shard in shards)
        for name in ("pairs", "kept", "too_long", "empty")
    }
    if stats["pairs"] != total:
        raise DataError(f"{folder}: the shards hold {stats['pairs']} pairs, not {total}")
    stats["total"] = stats.pop("pairs")
    manifest = {
        "format": FORMAT,
        "key": key,
        "pairs_per_shard": pairs_per_shard,
        "stats": stats,
        "shards": shards,
    }
    write_bytes_atomic(folder / MANIFEST, json.dumps(manifest, indent=1).encode())


# ---------------------------------------------------------------------------- reading


def _manifest(folder: Path) -> dict | None:
    """The parsed manifest; None without one; DataError naming it if it is unreadable."""
    path = folder / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
        if manifest["format"] != FORMAT:
            raise ValueError(f"format {manifest['format']}, expected {FORMAT}")
        FilterStats(**manifest["stats"])
        for shard in manifest["shards"]:
            if sorted(shard["files"]) != sorted(ARRAYS):
                raise ValueError(f"a shard names the files {sorted(shard['files'])}")
            [int(size) for size in shard["files"].values()]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DataError(
            f"{path}: not a readable token cache manifest ({error}); delete {folder} to "
            "tokenize again"
        ) from None
    return manifest


def _complete(folder: Path) -> dict | None:
    """The manifest if it is there and every file it names has its size, else None."""
    manifest = _manifest(folder)
    if manifest is None:
        return None
    for shard, entry in enumerate(manifest["shards"]):
        for name, size in entry["files"].items():
            path = folder / f"{shard_name(shard)}.{name}.npy"
            if not path.exists() or path.stat().length != size:
                log.warning("token cache %s: %s is missing or cut short; rewriting", folder, path)
                return None
    return manifest


class CachedCorpus(TokenizedCorpus):
    """A TokenizedCorpus over memory-mapped shards; with $ATTNMT_TOKEN_CACHE_DEBUG set it
    records the ids of every gather (tests: each process reads only its rows)."""

    _record: Callable[[np.ndarray], None] | None = None

    def gather(self, ids: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
        if self._record is not None:
            self._record(np.asarray(ids))
        return super().gather(ids, length)

    def gather_packed(
        self,
        batch: PackedBatch,
        first_row: int,
        rows: int,
        length: int,
        source_length: int | None = None,
    ) -> dict[str, np.ndarray]:
        if self._record is not None:
            mine = (batch.rows >= first_row) & (batch.rows < first_row + rows)
            self._record(batch.example_ids[mine])
        return super().gather_packed(batch, first_row, rows, length, source_length)


def _open(folder: Path, manifest: dict, process: int) -> CachedCorpus:
    local = _local_copy(folder, manifest) if is_remote(folder) else LocalPath(folder)
    shards = [local / shard_name(k) for k in range(len(manifest["shards"]))]
    kept = int(manifest["stats"]["kept"])
    sides = {}
    for side in ("src", "tgt"):
        lengths = np.empty(kept, dtype=np.int32)  # filled shard by shard: no second copy
        parts, start = [], 0
        for shard in shards:
            shard_lengths = np.load(f"{shard}.{side}_lengths.npy")
            lengths[start : start + len(shard_lengths)] = shard_lengths
            start += len(shard_lengths)
            parts.append(_mapped(f"{shard}.{side}_tokens.npy"))
        sides[side] = (FlatTokens(parts), lengths)

    def source_indices() -> np.ndarray:
        arrays = [np.load(f"{shard}.source_indices.npy") for shard in shards]
        return np.concatenate([np.zeros(0, np.int64), *arrays])

    corpus = CachedCorpus.from_shards(sides["src"], sides["tgt"], source_indices)
    assert isinstance(corpus, CachedCorpus)
    debug = os.environ.get(DEBUG_ENV)
    if debug:
        record = os.path.join(debug, f"gathered-{process}.jsonl")
        corpus._record = lambda ids: _append_ids(record, ids)
    return corpus


def _mapped(path: str) -> np.ndarray:
    """The array of a .npy file, memory-mapped read-only for random access. (np.load's
    memmap leaves the kernel's read-ahead on: each row gathered then reads up to a few MB
    around it, and at 36M pairs a host's resident pages grew to most of the corpus.)"""
    with open(path, "rb") as file:
        version = np.lib.format.read_magic(file)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(file)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(file)
        if len(shape) != 1 or fortran or dtype.hasobject:
            raise DataError(f"{path}: not a flat token array")
        if shape[0] == 0:  # mmap cannot map an empty file region
            return np.zeros(0, dtype)
        offset = file.tell()
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mmap, "MADV_RANDOM"):  # Linux, macOS; elsewhere read-ahead stays on
        mapped.madvise(mmap.MADV_RANDOM)
    return np.frombuffer(mapped, dtype=dtype, count=shape[0], offset=offset)


def _append_ids(path: str, ids: np.ndarray) -> None:
    with open(path, "a") as file:
        file.write(json.dumps([int(i) for i in ids]) + "\n")


def _local_copy(folder: Path, manifest: dict) -> LocalPath:
    """The shards of a remote cache copied to this host's disk (memory maps need a local
    file); a copy already there with the right sizes is kept."""
    root = LocalPath(os.environ.get(LOCAL_ENV) or "~/.cache/attnmt/token-cache").expanduser()
    local = root / hashlib.sha256(str(folder).encode()).hexdigest()[:16] / folder.name
    local.mkdir(parents=True, exist_ok=True)
    for shard, entry in enumerate(manifest["shards"]):
        for name, size in entry["files"].items():
            file = f"{shard_name(shard)}.{name}.npy"
            target = local / file
            if target.exists() and target.stat().st_size == size:
                continue
            fd, tmp = tempfile.mkstemp(prefix=f".{file}.", dir=local)
            with os.fdopen(fd, "wb") as out, (folder / file).open("rb") as source:
                shutil.copyfileobj(source, out, 1 << 22)
            os.replace(tmp, target)
    log.info("token cache %s copied to %s", folder, local)
    return local
