"""One sentencepiece vocabulary shared by source and target, with fixed special ids."""

from __future__ import annotations

import array
import io
import itertools
import math
import os
import random
import re
import sys
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from attnmt.common import BOS_ID, EOS_ID, NUM_SPECIAL_TOKENS, PAD_ID, UNK_ID
from attnmt.errors import DataError
from attnmt.storage import Path, as_path, write_bytes_atomic

WORD_START = "\u2581"  # sentencepiece's mark for a piece that begins a word
# Lone surrogates (text decoded with errors="surrogateescape", or built in Python) have no
# UTF-8 form, and sentencepiece takes only UTF-8: they become U+FFFD, as undecodable bytes
# read by the CLI do.
_SURROGATES = re.compile("[\ud800-\udfff]")


def sentencepiece_encode(processor: spm.SentencePieceProcessor, texts: str | list[str], **options):
    """`processor.encode(texts, **options)`, retried with lone surrogates replaced when
    sentencepiece refuses them (RuntimeError for one text, TypeError for a list): ordinary
    text pays nothing for the check."""
    try:
        return processor.encode(texts, **options)
    except (RuntimeError, TypeError):
        items = texts if isinstance(texts, list) else [texts]
        if not any(isinstance(text, str) and _SURROGATES.search(text) for text in items):
            raise
        cleaned = [_SURROGATES.sub("\ufffd", text) for text in items]
        return processor.encode(cleaned if isinstance(texts, list) else cleaned[0], **options)


def _nonempty(texts: Iterable[str]) -> Iterator[str]:
    for text in texts:
        if text and not text.isspace():
            yield text


def train_vocab(
    texts: Iterable[str],
    model_path: str | os.PathLike,
    vocab_size: int,
    model_type: str = "bpe",
    character_coverage: float = 1.0,
    max_sentences: int = 10_000_000,
    seed: int = 0,
    whole_words: Sequence[str] = (),
) -> Path:
    """Trains one shared sentencepiece model on ``texts`` and writes it to ``model_path``.

    Pass source and target sentences interleaved. ``whole_words``: space-delimited words
    that must each stay one piece (a parsing target's brackets and ``XX``). Writes
    ``model_path`` and the matching ``.vocab`` file atomically; returns ``model_path``.
    Above ``max_sentences`` sentences, a uniform sample of that many (``seed``) trains it.
    The same input and seed give the same bytes in any process.
    """
    _check_vocab_request(vocab_size, model_type)
    model_path = as_path(model_path, "vocabulary path")
    vocab_path = model_path.with_suffix(".vocab")

    # sentencepiece's own sampling (input_sentence_size with shuffle_input_sentence) gives a
    # different sample in every process whatever its generator's seed; sample here instead,
    # the same in any process, and let sentencepiece load exactly what it is given.
    spm.set_random_generator_seed(seed)  # for anything else sentencepiece draws
    fed = 0

    def counted() -> Iterator[str]:
        nonlocal fed
        for text in _nonempty(texts):
            fed += 1
            yield text

    sample = _sample_sentences(counted(), max_sentences, seed)
    try:
        model_bytes = _train_model_bytes(
            sample, vocab_size, model_type, character_coverage, whole_words
        )
    except RuntimeError as e:
        raise _training_error(e, vocab_size, fed) from None
    # .vocab first: a present .model then means both files are complete.
    write_bytes_atomic(vocab_path, _vocab_listing(model_bytes).encode("utf-8"))
    write_bytes_atomic(model_path, model_bytes)
    return model_path


def _train_model_bytes(
    sentences: list[str],
    vocab_size: int,
    model_type: str,
    character_coverage: float,
    whole_words: Sequence[str],
) -> bytes:
    """The serialized sentencepiece model trained on exactly ``sentences`` with attnmt's
    fixed special ids; sentencepiece's RuntimeError passes through."""
    # Train in memory (model_writer) rather than to a file prefix: the prefix would be
    # recorded in the model, so the same input would not give the same bytes.
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=proto,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        input_sentence_size=0,  # load every sentence given: the caller's sample
        shuffle_input_sentence=False,
        hard_vocab_limit=False,
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        bos_id=BOS_ID,
        unk_id=UNK_ID,
        # With the word-start mark: a bare `(NP` symbol would leave `▁` as a piece of
        # its own before every bracket, doubling the target's length.
        user_defined_symbols=[WORD_START + word for word in whole_words],
        minloglevel=2,
    )
    return proto.getvalue()


def _sample_sentences(texts: Iterable[str], size: int, seed: int) -> list[str]:
    """A uniform random sample of ``size`` of ``texts`` (all of them if there are no more),
    in corpus order; the same for the same input and seed in any process.

    Reservoir sampling by Li's Algorithm L (ACM TOMS 20(4), 1994): the gap to the next
    sentence that enters the reservoir is drawn directly, so only O(size·log(n/size)) random
    numbers are drawn for n sentences and the ones between are skipped at C speed. Only
    ``random.Random.random`` is used: for an integer seed Python guarantees its sequence
    across versions (``randrange`` has no such promise).
    """
    if size <= 0:
        raise DataError(f"max_sentences={size}: the vocabulary needs at least one sentence")
    it = iter(texts)
    kept = list(itertools.islice(it, size))
    if len(kept) < size:
        return kept
    rng = random.Random(seed)

    def uniform() -> float:  # in (0, 1): its log is finite
        u = rng.random()
        while u == 0.0:
            u = rng.random()
        return u

    where = array.array("q", range(size))  # the corpus index of each kept sentence
    index = size - 1  # of the last sentence read
    log_w = 0.0  # log W, W being the largest of the kept sentences' `size` uniform keys
    end = object()
    while True:
        log_w += math.log(uniform()) / size
        w = math.exp(log_w)
        log_1mw = math.log(-math.expm1(log_w)) if w > 0.5 else math.log1p(-w)  # log(1 - W)
        gap = min(int(math.log(uniform()) / log_1mw) + 1, sys.maxsize)
        text = next(itertools.islice(it, gap - 1, None), end)  # skips gap - 1 sentences
        if text is end:
            break
        index += gap
        slot = min(int(uniform() * size), size - 1)
        kept[slot] = text
        where[slot] = index
    order = np.argsort(np.frombuffer(where, dtype=np.int64), kind="stable")
    return [kept[j] for j in order]


def _check_vocab_request(vocab_size: int, model_type: str) -> None:
    if vocab_size <= NUM_SPECIAL_TOKENS:
        raise DataError(
            f"vocab_size={vocab_size} leaves no room for pieces: the {NUM_SPECIAL_TOKENS} special "
            "tokens (pad, eos, bos, unk) alone take that many ids"
        )
    if model_type not in ("bpe", "unigram", "char", "word"):
        raise DataError(f"unknown sentencepiece model_type {model_type!r}")


def _vocab_listing(model_bytes: bytes) -> str:
    """The .vocab file, for people: piece and score per line, as sentencepiece writes it."""
    sp = spm.SentencePieceProcessor(model_proto=model_bytes)
    return "".join(
        f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.get_piece_size())
    )


def _training_error(e: RuntimeError, vocab_size: int, fed: int) -> DataError:
    message = str(e)
    if fed == 0:
        return DataError("cannot train a vocabulary: no non-empty sentences were given")
    m = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", message)
    if m:
        return DataError(
            f"vocab_size={vocab_size} is too small: the corpus needs {m.group(2)} ids for its "
            "characters and special tokens; raise vocab_size or lower character_coverage"
        )
    return DataError(f"sentencepiece training failed: {message}")


class SpecialIds:
    """The ids every tokenizer reports; `_size` and `_start` are set by the subclass."""

    _size: int
    _start: int = BOS_ID

    @property
    def vocab_size(self) -> int:
        return self._size

    @property
    def pad_id(self) -> int:
        return PAD_ID

    @property
    def eos_id(self) -> int:
        return EOS_ID

    @property
    def bos_id(self) -> int:
        """The decoder's start token."""
        return self._start


class Tokenizer(SpecialIds):
    """Encodes text to ids (without EOS) and decodes ids back, stopping at EOS."""

    def __init__(
        self, processor: spm.SentencePieceProcessor, path: Path | None = None, threads: int = -1
    ) -> None:
        self._sp = processor
        self.path = path
        self._size = processor.get_piece_size()
        # Threads of encode_batch: sentencepiece's default (-1) is one per core; a worker
        # of a pool that already has one process per core (attnmt.data.token_cache) uses 1.
        self.threads = threads

    @property
    def processor(self) -> spm.SentencePieceProcessor:
        """The sentencepiece model (attnmt.data.subword_sampling samples with it)."""
        return self._sp

    def single_threaded(self) -> Tokenizer:
        """The same vocabulary, whose batches are encoded on one thread."""
        return Tokenizer(self._sp, self.path, threads=1)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        """Loads a model written by ``train_vocab``, from a local file or a bucket."""
        path = as_path(path, "vocabulary path")
        if not path.is_file():
            raise DataError(f"{path}: sentencepiece model not found")
        try:
            # From bytes: sentencepiece opens only local files itself.
            sp = spm.SentencePieceProcessor(model_proto=path.read_bytes())
        except (RuntimeError, OSError) as e:
            raise DataError(f"{path}: not a readable sentencepiece model ({e})") from None
        ids = (sp.pad_id(), sp.eos_id(), sp.bos_id(), sp.unk_id())
        if ids != (PAD_ID, EOS_ID, BOS_ID, UNK_ID):
            raise DataError(
                f"{path}: special ids (pad, eos, bos, unk) are {ids}, expected "
                f"{(PAD_ID, EOS_ID, BOS_ID, UNK_ID)}; train the vocabulary with attnmt"
            )
        return cls(sp, path)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without EOS."""
        return sentencepiece_encode(self._sp, text, out_type=int)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return sentencepiece_encode(self._sp, list(texts), out_type=int, num_threads=self.threads)

    def encode_target_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Target sentences: the shared model encodes both sides alike."""
        return self.encode_batch(texts)

    def _clean(self, ids: Sequence[int]) -> list[int]:
        out = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i in (PAD_ID, BOS_ID):
                continue
            # A model's output layer may be padded past the vocabulary; such ids are unknown.
            out.append(i if 0 <= i < self._size else UNK_ID)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` up to the first EOS, ignoring PAD and BOS."""
        return self._sp.decode(self._clean(ids))

    def decode_batch(self, batch: Iterable[Sequence[int]]) -> list[str]:
        return self._sp.decode([self._clean(ids) for ids in batch])

    def whole_words(self) -> dict[int, str]:
        """id → word of each piece trained as ``whole_words`` (without the word-start mark)."""
        model = sentencepiece_model_pb2.ModelProto.FromString(self._sp.serialized_model_proto())
        user_defined = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
        return {
            i: piece.piece.removeprefix(WORD_START)
            for i, piece in enumerate(model.pieces)
            if piece.type == user_defined
        }

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary piece of each id (for labelling attention maps)."""
        return [self._sp.id_to_piece(int(i)) for i in ids]
