"""BPE-dropout (attnmt.data.subword_sampling): what the segmentation must satisfy by the
definition of BPE-dropout, that an epoch's segmentation is a function of (seed, epoch)
in any thread and any process, and that the training iterator draws each epoch from its
own segmentation and resumes inside one exactly."""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from attnmt.config.data import DataConfig
from attnmt.data.pipeline import BatchIterator, TokenizedCorpus
from attnmt.data.subword_sampling import EpochCorpora, SampledTokenizer
from attnmt.data.tokenizer import Tokenizer, train_vocab
from attnmt.errors import ConfigError

WORD_START = "▁"


def _multi30k_texts(multi30k_dir: Path) -> list[str]:
    return [
        line.rstrip("\n")
        for name in ("train.en", "train.de", "val.fr")
        for line in (multi30k_dir / name).read_text(encoding="utf-8").splitlines()[:4000]
    ]


def test_without_dropout_it_is_sentencepiece_bpe(tokenizer, corpus_pairs) -> None:
    texts = [s for pair in corpus_pairs for s in pair] + ["", "  two  spaces ", "ünknöwn ✓✓ x"]
    ours = SampledTokenizer(tokenizer, 0.0, seed=0, epoch=0).encode_batch(texts)
    assert ours == tokenizer.encode_batch(texts)


def test_without_dropout_it_is_sentencepiece_bpe_on_multi30k(
    multi30k_dir: Path, tmp_path: Path
) -> None:
    texts = _multi30k_texts(multi30k_dir)
    vocab = Tokenizer.load(train_vocab(iter(texts), tmp_path / "v.model", vocab_size=3000))
    assert SampledTokenizer(vocab, 0.0, seed=0, epoch=0).encode_batch(texts) == (
        vocab.encode_batch(texts)
    )


def test_every_sampled_segmentation_spells_the_sentence(tokenizer, corpus_pairs) -> None:
    texts = [s for pair in corpus_pairs for s in pair]
    standard = tokenizer.encode_batch(texts)
    sampled = SampledTokenizer(tokenizer, 0.3, seed=0, epoch=0).encode_batch(texts)
    for text, plain, drawn in zip(texts, standard, sampled, strict=True):
        # The same characters, cut in other places.
        assert "".join(tokenizer.pieces(drawn)) == "".join(tokenizer.pieces(plain)), text
    # Skipping merges can only leave more pieces than standard BPE's greedy merging.
    assert sum(map(len, sampled)) > sum(map(len, standard))
    assert sum(a != b for a, b in zip(standard, sampled, strict=True)) > len(texts) // 4


def test_source_only_keeps_the_targets_standard_segmentation(tokenizer, corpus_pairs) -> None:
    epochs = EpochCorpora(corpus_pairs, tokenizer, 64, dropout=0.3, seed=1, target=False)
    corpus, standard = epochs(2), TokenizedCorpus.from_pairs(corpus_pairs, tokenizer, 64)[0]
    assert len(corpus) == len(standard)  # pairs of a few words: none reaches 64 tokens
    sources_differ = 0
    for i in range(len(corpus)):
        (src, tgt), (plain_src, plain_tgt) = corpus.example(i), standard.example(i)
        np.testing.assert_array_equal(tgt, plain_tgt)
        sources_differ += not np.array_equal(src, plain_src)
    assert sources_differ > len(corpus) // 4


def test_dropout_one_skips_every_merge(tokenizer, corpus_pairs) -> None:
    texts = [s for s, _ in corpus_pairs[:50]]
    for ids in SampledTokenizer(tokenizer, 1.0, seed=3, epoch=0).encode_batch(texts):
        assert all(len(piece) == 1 for piece in tokenizer.pieces(ids))


def _one_merge_word(tokenizer: Tokenizer) -> str:
    """A one-letter word whose word-start piece exists: its only possible merge is
    (▁, letter), so BPE-dropout leaves it in two pieces with exactly the dropout rate."""
    sp = tokenizer.processor
    for letter in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ":
        pieces = (WORD_START + letter, letter)
        if not any(sp.is_unknown(sp.piece_to_id(piece)) for piece in pieces):
            return letter
    pytest.skip("the test vocabulary has no one-letter word piece")


@pytest.mark.parametrize("dropout", [0.1, 0.5])
def test_a_word_with_one_merge_is_split_at_the_dropout_rate(tokenizer, dropout) -> None:
    word, n = _one_merge_word(tokenizer), 20_000
    drawn = SampledTokenizer(tokenizer, dropout, seed=11, epoch=2).encode_batch([word] * n)
    split = sum(len(ids) == 2 for ids in drawn)
    assert all(len(ids) in (1, 2) for ids in drawn)
    # Binomial(n, dropout): 6 standard deviations.
    assert abs(split / n - dropout) < 6 * math.sqrt(dropout * (1 - dropout) / n)


def _digest(corpus: TokenizedCorpus) -> str:
    h = hashlib.sha256()
    for i in range(len(corpus)):
        for side in corpus.example(i):
            h.update(np.asarray(side, np.int32).tobytes() + b"|")
    return h.hexdigest()


def _epochs(tokenizer, corpus_pairs, seed: int = 5) -> EpochCorpora:
    return EpochCorpora(corpus_pairs, tokenizer, max_length=64, dropout=0.2, seed=seed)


def test_an_epoch_is_a_function_of_seed_and_epoch(tokenizer, corpus_pairs) -> None:
    first = _digest(_epochs(tokenizer, corpus_pairs)(3))
    other = _epochs(tokenizer, corpus_pairs)
    other(1)  # the generator used in between changes nothing
    assert _digest(other(3)) == first
    assert _digest(other(4)) != first
    assert _digest(_epochs(tokenizer, corpus_pairs, seed=6)(3)) != first
    # On another thread, which has sampled before, with another thread sampling meanwhile.
    results: dict[str, str] = {}

    def draw(name: str, epoch: int) -> None:
        epochs = _epochs(tokenizer, corpus_pairs)
        epochs(0)
        results[name] = _digest(epochs(epoch))

    threads = [threading.Thread(target=draw, args=(f"t{i}", 3 + i % 2)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {"t0": first, "t1": _digest(other(4)), "t2": first, "t3": results["t1"]}


_IN_A_PROCESS = """
import hashlib, sys
import numpy as np
from attnmt.data.subword_sampling import EpochCorpora
from attnmt.data.tokenizer import Tokenizer, train_vocab
from tests.helpers import make_pairs
corpus = EpochCorpora(make_pairs(400, seed=1), Tokenizer.load(sys.argv[1]), 64, 0.2, 5)(3)
h = hashlib.sha256()
for i in range(len(corpus)):
    for side in corpus.example(i):
        h.update(np.asarray(side, np.int32).tobytes() + b"|")
print(h.hexdigest())
"""


def test_another_process_draws_the_same_epoch(tokenizer, corpus_pairs, vocab_path) -> None:
    run = subprocess.run(
        [sys.executable, "-c", _IN_A_PROCESS, str(vocab_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.strip() == _digest(_epochs(tokenizer, corpus_pairs)(3))


def _texts_of_batch(tokenizer: Tokenizer, batch: dict[str, np.ndarray]) -> list[str]:
    """The target sentences of a packed batch (one per segment of each row)."""
    out = []
    for tokens, segments in zip(batch["tgt_tokens"], batch["tgt_segments"], strict=True):
        for segment in sorted(set(segments.tolist()) - {0}):
            out.append(tokenizer.decode(tokens[segments == segment].tolist()))
    return out


def test_the_iterator_draws_each_epoch_from_its_own_segmentation(tokenizer, corpus_pairs) -> None:
    epochs = _epochs(tokenizer, corpus_pairs)
    batches = BatchIterator(epochs, [(8, 64)], seed=0, pack=True)
    targets = {t for _, t in corpus_pairs}
    seen: dict[int, list[np.ndarray]] = {}
    while True:
        batch = next(batches)  # the epoch a batch came from is known once it is drawn
        if batches.epoch == 3:
            break
        # Every packed example decodes to a training target.
        assert set(_texts_of_batch(tokenizer, batch)) <= targets
        seen.setdefault(batches.epoch, []).append(batch["tgt_tokens"])
    assert sorted(seen) == [0, 1, 2]
    # Each epoch's tokens are its own corpus's: as many target tokens as that corpus
    # holds (every pair fits a row of 64 here), and the epochs' corpora differ.
    for epoch, arrays in seen.items():
        assert sum(int((a > 0).sum()) for a in arrays) == int(epochs(epoch).tgt_lengths.sum())
    assert len({int(epochs(e).tgt_lengths.sum()) for e in range(3)}) > 1


def test_resume_inside_a_sampled_epoch_is_exact(tokenizer, corpus_pairs) -> None:
    def iterator() -> BatchIterator:
        return BatchIterator(_epochs(tokenizer, corpus_pairs), [(8, 64)], seed=4, pack=True)

    reference = iterator()
    states, drawn = [], []
    for _ in range(60):
        states.append(reference.get_state())
        drawn.append(next(reference))
    assert drawn and reference.epoch >= 1
    for at in (7, len(drawn) - 5):
        resumed = iterator()  # a new process: its own corpora, first at epoch 0
        resumed.set_state(states[at])
        for expected in drawn[at:]:
            got = next(resumed)
            for key, value in expected.items():
                np.testing.assert_array_equal(got[key], value)


def test_config_rejects_subword_dropout_it_cannot_apply() -> None:
    with pytest.raises(ConfigError, match=r"data\.subword_dropout"):
        DataConfig(subword_dropout=1.5)
    with pytest.raises(ConfigError, match=r"vocab_model_type='bpe'"):
        DataConfig(subword_dropout=0.1, vocab_model_type="unigram")
    with pytest.raises(ConfigError, match=r"data\.subword_dropout"):
        DataConfig(subword_dropout=0.1, vocab_kind="pair")
    assert DataConfig(subword_dropout=0.1).subword_dropout == 0.1
