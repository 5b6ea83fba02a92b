"""BPE-dropout (Provilkov et al., 2020): every training epoch segments its sentences anew,
so the model sees many segmentations of a word while validation, test and decoding keep
the standard one.

The segmentation is the paper's Algorithm 1 over the sentencepiece BPE model's pieces: a
word starts as characters; at each step every adjacent pair whose concatenation is a
piece is a candidate, each candidate is dropped with probability p, the best-scored one
left is merged, and the word is done when none is left. With p = 0 this is
sentencepiece's own BPE segmentation (tests compare the two on whole corpora).

It is written here rather than taken from sentencepiece's `enable_sampling`, whose draws
come from a generator per thread that `set_random_generator_seed` does not make
reproducible across processes (sentencepiece 0.2.3: the same seed, text and call give
another segmentation in another process), while a resumed run and every process of a job
must see the same epoch. Here the draws come from a NumPy generator seeded by
(seed, epoch), consumed in a fixed order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sentencepiece import sentencepiece_model_pb2

from attnmt.data.pipeline import FilterStats, TokenizedCorpus
from attnmt.data.tokenizer import WORD_START, Tokenizer
from attnmt.errors import DataError

_BLOCK = 1 << 16  # uniform draws fetched from the generator at a time


def _merge_scores(tokenizer: Tokenizer) -> dict[str, float]:
    """Each ordinary piece's score: the higher, the earlier BPE merges it."""
    model = sentencepiece_model_pb2.ModelProto.FromString(
        tokenizer.processor.serialized_model_proto()
    )
    if model.trainer_spec.model_type != sentencepiece_model_pb2.TrainerSpec.BPE:
        raise DataError(f"{tokenizer.path}: BPE-dropout needs a BPE vocabulary")
    normal = sentencepiece_model_pb2.ModelProto.SentencePiece.NORMAL
    return {p.piece: p.score for p in model.pieces if p.type == normal}


class SampledTokenizer:
    """Encodes batches as `tokenizer` does, but segments each word with BPE-dropout at
    rate `dropout`; the draws of all its calls form one stream seeded by (seed, epoch),
    so the same sequence of calls gives the same ids anywhere."""

    def __init__(
        self, tokenizer: Tokenizer, dropout: float, seed: int, epoch: int, target: bool = True
    ) -> None:
        if not 0.0 <= dropout <= 1.0:  # 0: standard BPE; 1: characters only
            raise ValueError(f"BPE-dropout must be in [0, 1], got {dropout}")
        self._tokenizer = tokenizer
        self._scores = _merge_scores(tokenizer)
        sp = tokenizer.processor
        self._ids = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
        self._unknown = sp.unk_id()
        self._dropout = dropout
        self._target = target  # False: targets get the standard segmentation
        self._rng = np.random.default_rng(np.random.SeedSequence([seed, epoch]))
        self._draws: list[float] = []
        self._next = 0

    def _characters(self, texts: Sequence[str]) -> list[list[str]]:
        """Each text normalized and cut into characters (sentencepiece skips every merge
        at alpha 1 without drawing), unknown runs kept whole as sentencepiece keeps them."""
        return self._tokenizer.processor.encode(
            list(texts),
            out_type=str,
            enable_sampling=True,
            alpha=1.0,
            num_threads=self._tokenizer.threads,
        )

    def _reserve(self, count: int) -> None:
        """At least `count` unused draws in hand."""
        if len(self._draws) - self._next < count:
            need = max(_BLOCK, count)
            self._draws = self._draws[self._next :] + self._rng.random(need).tolist()
            self._next = 0

    def _segment(self, symbols: list[str]) -> list[str]:
        """One word's pieces (Algorithm 1 of the paper)."""
        scores, dropout = self._scores, self._dropout
        n = len(symbols)
        self._reserve(n * (n - 1) // 2)  # at most one draw per candidate per step
        draws, k = self._draws, self._next
        while len(symbols) > 1:
            best, best_score = -1, 0.0
            for i in range(len(symbols) - 1):
                score = scores.get(symbols[i] + symbols[i + 1])
                if score is None:
                    continue
                if dropout:
                    k += 1
                    if draws[k - 1] < dropout:
                        continue
                if best < 0 or score > best_score:  # ties: the leftmost, as sentencepiece
                    best, best_score = i, score
            if best < 0:
                break
            symbols[best : best + 2] = [symbols[best] + symbols[best + 1]]
        self._next = k
        return symbols

    def _encode(self, characters: list[str]) -> list[int]:
        ids, word, get, unknown = [], [], self._ids.get, self._unknown
        for symbol in [*characters, WORD_START]:  # a word starts at each word-start mark
            if symbol.startswith(WORD_START) and word:
                ids.extend(get(piece, unknown) for piece in self._segment(word))
                word = []
            word.append(symbol)
        return ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self._encode(chars) for chars in self._characters(texts)]

    def encode_target_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if not self._target:
            return self._tokenizer.encode_target_batch(texts)
        return self.encode_batch(texts)


class EpochCorpora:
    """The training corpus of each epoch, tokenized with BPE-dropout from the split's text
    (held in memory: meant for corpora that segment in seconds, such as Multi30K's 29k
    pairs in about 5 s on one core). The latest epoch's corpus is kept."""

    def __init__(
        self,
        pairs: Sequence[tuple[str, str]],
        tokenizer: Tokenizer,
        max_length: int,
        dropout: float,
        seed: int,
        target: bool = True,
    ) -> None:
        self.pairs = pairs
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.dropout = dropout
        self.seed = seed
        self.target = target  # False: BPE-dropout on the source side only
        self._latest: tuple[int, TokenizedCorpus, FilterStats] | None = None

    def tokenize(self, epoch: int) -> tuple[TokenizedCorpus, FilterStats]:
        """Epoch `epoch`'s corpus and what its filtering (data.max_length) kept."""
        if self._latest is None or self._latest[0] != epoch:
            self._latest = None  # one epoch held at a time
            sampled = SampledTokenizer(
                self.tokenizer, self.dropout, self.seed, epoch, target=self.target
            )
            corpus, stats = TokenizedCorpus.from_pairs(self.pairs, sampled, self.max_length)
            self._latest = (epoch, corpus, stats)
        return self._latest[1], self._latest[2]

    def __call__(self, epoch: int) -> TokenizedCorpus:
        return self.tokenize(epoch)[0]
