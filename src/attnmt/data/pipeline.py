"""From sentence pairs to padded numpy batches, with a resumable, shardable iterator."""

from __future__ import annotations

import itertools
import os
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from attnmt.common import EOS_ID, PAD_ID
from attnmt.data.batching import PlannedBatch, assign_buckets, plan_epoch
from attnmt.data.packing import EpochPacker, PackedBatch, epoch_order, fill_rows
from attnmt.data.tokenizer import Tokenizer
from attnmt.errors import DataError
from attnmt.storage import as_path, write_atomic

_FORMAT_VERSION = 1
_ENCODE_CHUNK = 8192  # pairs per encode_batch call: fast, yet bounded memory


@dataclass(frozen=True)
class FilterStats:
    """What happened to the pairs given to ``TokenizedCorpus.from_pairs``.

    ``total == kept + too_long + empty``; a pair with an empty side counts as empty even
    if its other side is too long.
    """

    total: int
    kept: int
    too_long: int
    empty: int


class FlatTokens:
    """The concatenation of token arrays (each may be memory-mapped), read by position
    without ever being joined: only the pages holding the positions asked for are read."""

    def __init__(self, parts: Sequence[np.ndarray]) -> None:
        self._parts = list(parts)
        self._starts = np.cumsum([0, *map(len, self._parts)], dtype=np.int64)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, where: np.ndarray | slice) -> np.ndarray:
        """int32 tokens at the positions `where` (an index array of any shape, or a slice)."""
        if isinstance(where, slice):
            where = np.arange(*where.indices(len(self)), dtype=np.int64)
        where = np.asarray(where, dtype=np.int64)
        if len(self._parts) == 1:
            return self._parts[0][where].astype(np.int32)
        part = np.searchsorted(self._starts, where, side="right") - 1
        out = np.empty(where.shape, dtype=np.int32)
        for k in np.unique(part):
            chosen = part == k
            out[chosen] = self._parts[k][where[chosen] - self._starts[k]]
        return out


def _offsets(lengths: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


class _Side:
    """Flat tokens plus offsets: example i is ``tokens[offsets[i]:offsets[i + 1]]``; the
    tokens are an int32 array or a FlatTokens view of memory-mapped shards."""

    def __init__(self, tokens: np.ndarray | FlatTokens, offsets: np.ndarray) -> None:
        self.tokens = tokens if isinstance(tokens, FlatTokens) else np.asarray(tokens, np.int32)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.lengths = np.diff(self.offsets).astype(np.int32)

    @classmethod
    def from_lengths(cls, tokens: FlatTokens, lengths: np.ndarray) -> _Side:
        side = cls.__new__(cls)
        side.tokens, side.lengths = tokens, np.asarray(lengths, dtype=np.int32)
        side.offsets = _offsets(side.lengths)
        return side

    def gather(self, ids: np.ndarray, length: int) -> np.ndarray:
        """Right-padded [len(ids), length] int32 rows; id -1 gives an all-PAD row."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(self.tokens) == 0:
            return np.full((len(ids), length), PAD_ID, dtype=np.int32)
        real = ids >= 0
        lens = np.where(real, self.lengths[np.where(real, ids, 0)], 0)
        starts = self.offsets[np.where(real, ids, 0)]
        cols = np.arange(length)
        mask = cols[None, :] < lens[:, None]
        # Clip so masked-out slots index a valid position; their value is replaced by PAD.
        pos = np.minimum(starts[:, None] + cols[None, :], len(self.tokens) - 1)
        return np.where(mask, self.tokens[pos], PAD_ID).astype(np.int32)


@dataclass(frozen=True)
class EncodedChunk:
    """Some consecutive pairs tokenized, EOS appended, filtered: the kept pairs' flat tokens
    and lengths (EOS included) per side, their positions among all pairs, and the counts."""

    src_tokens: np.ndarray  # int32
    src_lengths: np.ndarray  # int64
    tgt_tokens: np.ndarray
    tgt_lengths: np.ndarray
    source_indices: np.ndarray  # int64
    total: int
    too_long: int
    empty: int


def encode_chunk(
    chunk: Sequence[tuple[str, str]], tokenizer: Tokenizer, max_length: int, first_index: int
) -> EncodedChunk:
    """Tokenizes `chunk` (pairs `first_index`, `first_index + 1`, … of a corpus), appends EOS
    and drops empty and too-long (> max_length) pairs."""
    src_ids = tokenizer.encode_batch([s for s, _ in chunk])
    tgt_ids = tokenizer.encode_target_batch([t for _, t in chunk])
    slen = np.fromiter(map(len, src_ids), np.int64, len(chunk))
    tlen = np.fromiter(map(len, tgt_ids), np.int64, len(chunk))
    is_empty = (slen == 0) | (tlen == 0)
    is_long = ~is_empty & ((slen + 1 > max_length) | (tlen + 1 > max_length))
    keep = np.flatnonzero(~is_empty & ~is_long)

    def flat(ids: list[list[int]], lens: np.ndarray) -> np.ndarray:
        rows = itertools.chain.from_iterable(ids[i] + [EOS_ID] for i in keep)
        return np.fromiter(rows, np.int32, int(lens[keep].sum()) + len(keep))

    return EncodedChunk(
        flat(src_ids, slen),
        slen[keep] + 1,
        flat(tgt_ids, tlen),
        tlen[keep] + 1,
        keep + first_index,
        len(chunk),
        int(is_long.sum()),
        int(is_empty.sum()),
    )


def _concat(arrays: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype) if arrays else np.zeros(0, dtype)


class TokenizedCorpus:
    """A tokenized parallel corpus stored compactly; every example ends with EOS."""

    def __init__(
        self,
        src_tokens: np.ndarray,
        src_offsets: np.ndarray,
        tgt_tokens: np.ndarray,
        tgt_offsets: np.ndarray,
        source_indices: np.ndarray | None = None,
    ) -> None:
        self._set_sides(_Side(src_tokens, src_offsets), _Side(tgt_tokens, tgt_offsets))
        n = len(self._src.lengths)
        # Position of each example in the pairs it was built from (filtering drops some).
        self._indices: np.ndarray | Callable[[], np.ndarray] = (
            np.arange(n, dtype=np.int64)
            if source_indices is None
            else np.asarray(source_indices, dtype=np.int64)
        )

    def _set_sides(self, src: _Side, tgt: _Side) -> None:
        if len(src.lengths) != len(tgt.lengths):
            raise ValueError("source and target sides hold different numbers of examples")
        self._src, self._tgt = src, tgt

    @classmethod
    def from_shards(
        cls,
        src: tuple[FlatTokens, np.ndarray],
        tgt: tuple[FlatTokens, np.ndarray],
        source_indices: Callable[[], np.ndarray],
    ) -> TokenizedCorpus:
        """A corpus over (tokens, lengths) of each side, its tokens left where they are
        (attnmt.data.token_cache memory-maps them); `source_indices` is read on first use."""
        corpus = cls.__new__(cls)
        corpus._set_sides(_Side.from_lengths(*src), _Side.from_lengths(*tgt))
        corpus._indices = source_indices
        return corpus

    @property
    def source_indices(self) -> np.ndarray:
        """Position of each example among the pairs it was built from (int64)."""
        if callable(self._indices):
            self._indices = self._indices()
        return self._indices

    @classmethod
    def from_pairs(
        cls, pairs: Iterable[tuple[str, str]], tokenizer: Tokenizer, max_length: int
    ) -> tuple[TokenizedCorpus, FilterStats]:
        """Tokenizes pairs, appends EOS, drops empty and too-long (> max_length) pairs."""
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2 (a token and EOS), got {max_length}")
        chunks: list[EncodedChunk] = []
        total = 0
        it = iter(pairs)
        while chunk := list(itertools.islice(it, _ENCODE_CHUNK)):
            chunks.append(encode_chunk(chunk, tokenizer, max_length, total))
            total += len(chunk)

        def joined(name: str, dtype: type) -> np.ndarray:
            return _concat([getattr(c, name) for c in chunks], dtype)

        corpus = cls(
            joined("src_tokens", np.int32),
            _offsets(joined("src_lengths", np.int64)),
            joined("tgt_tokens", np.int32),
            _offsets(joined("tgt_lengths", np.int64)),
            joined("source_indices", np.int64),
        )
        too_long = sum(c.too_long for c in chunks)
        empty = sum(c.empty for c in chunks)
        stats = FilterStats(total=total, kept=len(corpus), too_long=too_long, empty=empty)
        return corpus, stats

    def __len__(self) -> int:
        return len(self._src.lengths)

    @property
    def src_lengths(self) -> np.ndarray:
        """Source lengths including EOS."""
        return self._src.lengths

    @property
    def tgt_lengths(self) -> np.ndarray:
        """Target lengths including EOS."""
        return self._tgt.lengths

    def example(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(src_ids, tgt_ids) of example ``i``, each ending with EOS."""
        if not 0 <= i < len(self):
            raise IndexError(f"example {i} out of range for a corpus of {len(self)}")
        s, t = self._src, self._tgt
        return (
            s.tokens[s.offsets[i] : s.offsets[i + 1]],
            t.tokens[t.offsets[i] : t.offsets[i + 1]],
        )

    def gather(self, ids: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
        """Padded (src, tgt) [len(ids), length] arrays; id -1 gives an all-PAD row."""
        return self._src.gather(ids, length), self._tgt.gather(ids, length)

    def gather_packed(
        self,
        batch: PackedBatch,
        first_row: int,
        rows: int,
        length: int,
        source_length: int | None = None,
    ) -> dict[str, np.ndarray]:
        """Rows ``first_row … first_row + rows - 1`` of a packed batch: tokens, segment ids
        and positions of both sides (attnmt.common), the source side `source_length`
        (None: `length`) tokens wide."""
        out = {}
        widths = (length if source_length is None else source_length, length)
        for side, name, width in zip((self._src, self._tgt), ("src", "tgt"), widths, strict=True):
            tokens, segments, positions = fill_rows(
                side.tokens, side.offsets, batch, first_row, rows, width
            )
            out[f"{name}_tokens"] = tokens
            out[f"{name}_segments"] = segments
            out[f"{name}_positions"] = positions
        return out

    def save(self, path: str | os.PathLike) -> None:
        """Writes the corpus to one ``.npz`` file (local or in a bucket), atomically."""

        def write(file: IO[bytes]) -> None:  # a file object stops numpy appending ".npz"
            np.savez(
                file,
                format_version=np.int64(_FORMAT_VERSION),
                src_tokens=self._src.tokens[:],  # [:]: a FlatTokens view read whole
                src_offsets=self._src.offsets,
                tgt_tokens=self._tgt.tokens[:],
                tgt_offsets=self._tgt.offsets,
                source_indices=self.source_indices,
            )

        write_atomic(as_path(path, "token cache"), write)

    @classmethod
    def load(cls, path: str | os.PathLike) -> TokenizedCorpus:
        """Reads a corpus written by ``save``."""
        path = as_path(path, "token cache")
        if not path.is_file():
            raise DataError(f"{path}: tokenized corpus not found")
        keys = ("src_tokens", "src_offsets", "tgt_tokens", "tgt_offsets", "source_indices")
        try:
            with path.open("rb") as file, np.load(file, allow_pickle=False) as z:
                version = int(z["format_version"])
                arrays = {k: z[k] for k in keys}
        except (OSError, KeyError, ValueError, zipfile.BadZipFile, EOFError) as e:
            raise DataError(f"{path}: not a readable tokenized corpus ({e})") from None
        if version != _FORMAT_VERSION:
            raise DataError(
                f"{path}: tokenized corpus format {version}, expected {_FORMAT_VERSION}; "
                "delete it to re-tokenize"
            )
        return cls(**arrays)


def padding_fraction(batch: dict[str, np.ndarray]) -> float:
    """Fraction of PAD slots on both sides, counting only rows that hold an example."""
    src, tgt = batch["src_tokens"], batch["tgt_tokens"]
    present = (src != PAD_ID).any(axis=1) | (tgt != PAD_ID).any(axis=1)
    slots = int(present.sum()) * (src.shape[1] + tgt.shape[1])
    if slots == 0:
        return 0.0
    pads = int((src[present] == PAD_ID).sum() + (tgt[present] == PAD_ID).sum())
    return pads / slots


def split_batch(batch: dict[str, np.ndarray], parts: int, rows: int) -> list[dict[str, np.ndarray]]:
    """`batch` as `parts` batches of `rows` rows each, its rows in order; all-padding rows
    (which weigh nothing in the loss) fill the last ones."""
    have = len(batch["src_tokens"])
    if parts * rows < have:
        raise ValueError(f"{parts} parts of {rows} rows cannot hold {have} rows")
    if parts == 1 and rows == have:
        return [batch]
    padded = {
        name: np.pad(value, ((0, parts * rows - have), (0, 0)), constant_values=PAD_ID)
        for name, value in batch.items()
    }
    return [
        {name: value[i * rows : (i + 1) * rows] for name, value in padded.items()}
        for i in range(parts)
    ]


class BatchIterator:
    """Endless (or one-epoch) stream of padded batches; resumable and shardable.

    Each global batch has a shape from ``shapes``; this process gets rows
    ``[shard_index * b, (shard_index + 1) * b)`` with ``b = batch_size // shard_count``,
    so all processes step through the same sequence of global batches. With ``pack``,
    ``shapes`` is one (rows, length) shape and each row holds as many examples as fit
    (attnmt.data.packing), its source side ``pack_source_length`` tokens (0: ``length``);
    an epoch draws its example order at its start and packs each
    batch when it is drawn (on the training loop's prefetch thread), so no epoch is
    planned ahead and a saved position (``packed_offset``) resumes at once.

    ``corpus`` may instead be a function of the epoch number that returns that epoch's
    corpus (attnmt.data.subword_sampling: a new segmentation each epoch); it must return
    the same corpus for the same epoch wherever it runs, as a saved position relies on it.
    """

    def __init__(
        self,
        corpus: TokenizedCorpus | Callable[[int], TokenizedCorpus],
        shapes: list[tuple[int, int]],
        seed: int,
        shuffle: bool = True,
        repeat: bool = True,
        shard_index: int = 0,
        shard_count: int = 1,
        pack: bool = False,
        pack_source_length: int = 0,
    ) -> None:
        if pack and len(shapes) != 1:
            raise ValueError(f"packing fills one (rows, length) shape, got {shapes}")
        if pack_source_length and not pack:
            raise ValueError("pack_source_length is the source width of packed rows")
        if shard_count < 1 or not 0 <= shard_index < shard_count:
            raise ValueError(f"bad shard {shard_index} of {shard_count}")
        bad = [b for b, _ in shapes if b % shard_count]
        if bad:
            raise ValueError(
                f"batch sizes {bad} are not divisible by shard_count={shard_count}; "
                f"use a batch_multiple that is a multiple of {shard_count}"
            )
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self._corpus_of = corpus if callable(corpus) else lambda _epoch: corpus
        self._epoch = 0
        corpus = self.corpus
        self.shapes = list(shapes)
        self.shuffle = shuffle
        self.repeat = repeat
        self.shard_index = shard_index
        self.shard_count = shard_count
        self.pack = pack
        self.source_length = pack_source_length or (self.shapes[0][1] if pack else None)
        if self.source_length is not None and self.source_length < 1:
            raise ValueError(f"pack_source_length must be positive, got {pack_source_length}")
        # Of the first epoch (a corpus per epoch may keep a few more or fewer).
        if pack:
            self.examples_per_epoch = int(self.fits_a_row().sum())
        else:
            buckets = assign_buckets(corpus.src_lengths, corpus.tgt_lengths, self.shapes)
            self.examples_per_epoch = int((buckets < len(self.shapes)).sum())
        if repeat and self.examples_per_epoch == 0:
            raise ValueError(
                f"none of the {len(corpus)} examples fits the longest bucket "
                f"({self.shapes[-1][1]} tokens); an endless iterator would never yield"
            )
        self._seed = seed
        self._index = 0
        self._plan: list[PlannedBatch] | None = None  # bucketed: the epoch's batches
        # Packed: where in the epoch's order the next batch starts (None: not known yet,
        # from a state saved without it), the packer positioned there, and the order.
        self._offset: int | None = 0
        self._packer: EpochPacker | None = None
        self._order: tuple[tuple[int, int, bool], np.ndarray] | None = None

    @property
    def corpus(self) -> TokenizedCorpus:
        """The current epoch's corpus."""
        return self._corpus_of(self._epoch)

    def fits_a_row(self) -> np.ndarray:
        """Packed: which examples fit a row on both sides (the others are left out)."""
        c, length = self.corpus, self.shapes[0][1]
        return (c.src_lengths <= self.source_length) & (c.tgt_lengths <= length)

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from (0-based)."""
        return self._epoch

    def _current_plan(self) -> list[PlannedBatch]:
        if self._plan is None:
            c = self.corpus
            epoch = (self._seed, self._epoch, self.shuffle)
            self._plan = plan_epoch(c.src_lengths, c.tgt_lengths, self.shapes, *epoch)
        return self._plan

    def _epoch_order(self) -> np.ndarray:
        """The packing order of the current epoch (kept while the epoch lasts: restoring a
        position in it, as the training loop does when it stops, draws nothing again)."""
        key = (self._seed, self._epoch, self.shuffle)
        if self._order is None or self._order[0] != key:
            self._order = None  # one order held at a time (4 bytes an example)
            self._order = (key, epoch_order(len(self.corpus), *key))
        return self._order[1]

    def _current_packer(self) -> EpochPacker:
        """The packer of the current epoch at the next batch; a position saved without
        its offset is found by packing the epoch again up to it (slow, but exact)."""
        if self._packer is None:
            c, (rows, length) = self.corpus, self.shapes[0]
            order, offset = self._epoch_order(), self._offset
            if offset is not None and 0 < offset < len(order):
                first = order[offset]
                if c.src_lengths[first] > self.source_length or c.tgt_lengths[first] > length:
                    raise ValueError(
                        f"bad iterator state: packed_offset={offset} does not start a "
                        f"batch of epoch {self._epoch} (a state of another corpus?)"
                    )
            packer = EpochPacker(
                c.src_lengths, c.tgt_lengths, order, rows, length, offset or 0, self.source_length
            )
            if offset is None:
                for _ in itertools.islice(packer, self._index):
                    pass
                self._offset = packer.offset
            self._packer = packer
        return self._packer

    def _next_packed(self) -> PackedBatch | None:
        """The next batch of the current epoch, packed now; None at the epoch's end."""
        packer, self._packer = self._current_packer(), None
        # Kept only once packed: a batch cut short (an exception) leaves the packer
        # mid-batch, so the next call starts again from the offset instead.
        batch = next(packer, None)
        self._packer, self._offset = packer, packer.offset
        return batch

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.pack:
            return self._packed_rows()
        plan = self._current_plan()
        if self._index >= len(plan):
            if not self.repeat:
                raise StopIteration
            self._start_epoch(self._epoch + 1)
            plan = self._current_plan()
        entry = plan[self._index]
        self._index += 1
        batch_size, length = self.shapes[entry.shape_index]
        rows = batch_size // self.shard_count
        # Filler rows (-1) pad the last batch of a bucket up to its fixed batch size.
        ids = np.full(batch_size, -1, dtype=np.int64)
        ids[: len(entry.example_ids)] = entry.example_ids
        ids = ids[self.shard_index * rows : (self.shard_index + 1) * rows]
        src, tgt = self.corpus.gather(ids, length)
        return {"src_tokens": src, "tgt_tokens": tgt}

    def _packed_rows(self) -> dict[str, np.ndarray]:
        """This process's rows of the next packed batch."""
        entry = self._next_packed()
        if entry is None:
            if not self.repeat:
                raise StopIteration
            self._start_epoch(self._epoch + 1)
            entry = self._next_packed()
            assert entry is not None, "an epoch of examples that fit holds a batch"
        self._index += 1
        batch_size, length = self.shapes[0]
        rows = batch_size // self.shard_count
        first_row = self.shard_index * rows
        return self.corpus.gather_packed(entry, first_row, rows, length, self.source_length)

    def _start_epoch(self, epoch: int) -> None:
        self._epoch, self._index, self._offset = epoch, 0, 0
        self._plan = self._packer = None

    def get_state(self) -> dict[str, int]:
        """JSON-serialisable position: the next batch is batch ``index`` of ``epoch``;
        packed, it starts at ``packed_offset`` in the epoch's order (absent while not yet
        known, after restoring a state that had none)."""
        state = {"epoch": self._epoch, "index": self._index, "seed": self._seed}
        if self.pack and self._offset is not None:
            state["packed_offset"] = self._offset
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues from ``state`` (from ``get_state``), including its seed. A packed
        state without ``packed_offset`` (saved before it existed) is exact too: the first
        batch drawn packs the epoch up to it again. Bucketed iterators ignore the offset."""
        try:
            epoch, index, seed = (int(state[k]) for k in ("epoch", "index", "seed"))
            offset = int(state["packed_offset"]) if "packed_offset" in state else None
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"bad iterator state {state!r}: {e}") from None
        if epoch < 0 or index < 0 or seed < 0:
            raise ValueError(f"bad iterator state {state!r}: values must be >= 0")
        if self.pack and offset is not None:
            _check_offset(state, offset, index, len(self._corpus_of(epoch)))
        self._start_epoch(epoch)
        self._index, self._seed = index, seed
        if self.pack and index > 0:
            self._offset = offset


def _check_offset(state: dict[str, Any], offset: int, index: int, count: int) -> None:
    """What a packed offset must satisfy whatever the batches: each batch holds at least
    one example, so batch ``index`` starts at or after example ``index`` (at 0 for 0)."""
    if not index <= offset <= count or (offset == 0) != (index == 0):
        raise ValueError(
            f"bad iterator state {state!r}: packed_offset={offset} is not where batch "
            f"{index} of an epoch of {count} examples can start"
        )
