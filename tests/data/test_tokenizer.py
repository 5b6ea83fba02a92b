"""Shared sentencepiece vocabulary: special ids, roundtrip, EOS handling, determinism."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from attnmt.common import BOS_ID, EOS_ID, NUM_SPECIAL_TOKENS, PAD_ID, UNK_ID
from attnmt.data.tokenizer import Tokenizer, _sample_sentences, train_vocab
from attnmt.errors import DataError
from tests.helpers import interleave, make_pairs


def test_special_ids_fixed(vocab_path: Path, tokenizer: Tokenizer) -> None:
    assert (PAD_ID, EOS_ID, BOS_ID, UNK_ID, NUM_SPECIAL_TOKENS) == (0, 1, 2, 3, 4)
    # Reference: sentencepiece's own view of the written model.
    sp = spm.SentencePieceProcessor(model_file=str(vocab_path))
    assert (sp.pad_id(), sp.eos_id(), sp.bos_id(), sp.unk_id()) == (0, 1, 2, 3)
    assert [sp.id_to_piece(i) for i in range(3)] == ["<pad>", "</s>", "<s>"]
    assert (tokenizer.pad_id, tokenizer.eos_id, tokenizer.bos_id) == (0, 1, 2)
    assert tokenizer.vocab_size == sp.get_piece_size()
    assert vocab_path.with_suffix(".vocab").is_file()
    # Only the two final files are left: no temp prefix or folder.
    assert sorted(p.name for p in vocab_path.parent.iterdir()) == ["vocab.model", "vocab.vocab"]


def test_roundtrip(tokenizer: Tokenizer, corpus_pairs) -> None:
    texts = interleave(corpus_pairs[:50])
    for text in texts:
        ids = tokenizer.encode(text)
        assert ids and min(ids) >= NUM_SPECIAL_TOKENS  # in-vocabulary text: no special/unk ids
        assert tokenizer.decode(ids) == text
    assert tokenizer.encode_batch(texts) == [tokenizer.encode(t) for t in texts]
    assert tokenizer.decode_batch(tokenizer.encode_batch(texts)) == texts


def test_lone_surrogates_are_encoded_as_the_replacement_character(tokenizer: Tokenizer) -> None:
    # Python strings may hold them (errors="surrogateescape"); UTF-8, and so sentencepiece,
    # cannot. Found by tests/decode/test_translate_fuzz.py: translate(["\ud800"]) raised.
    texts = ["the \ud800 dog", "\udcff", "a \udfff\ud800 cat"]
    expected = ["the \ufffd dog", "\ufffd", "a \ufffd\ufffd cat"]
    for text, replaced in zip(texts, expected, strict=True):
        assert tokenizer.encode(text) == tokenizer.encode(replaced)
    assert tokenizer.encode_batch(["a dog", *texts]) == tokenizer.encode_batch(["a dog", *expected])


def test_decode_stops_at_eos_ignores_pad_bos(tokenizer: Tokenizer) -> None:
    a, b = tokenizer.encode("the red dog"), tokenizer.encode("ein hund")
    assert tokenizer.decode([*a, EOS_ID, *b]) == "the red dog"
    assert tokenizer.decode([BOS_ID, *a, EOS_ID, PAD_ID, PAD_ID]) == "the red dog"
    assert tokenizer.decode([PAD_ID, *a[:1], PAD_ID, *a[1:]]) == "the red dog"
    assert tokenizer.decode([EOS_ID, *a]) == ""
    assert tokenizer.decode_batch([[*a, EOS_ID, *b], [*b]]) == ["the red dog", "ein hund"]


def test_decode_tolerates_out_of_range_ids(tokenizer: Tokenizer) -> None:
    # A model's output layer may be wider than the vocabulary.
    text = tokenizer.decode([*tokenizer.encode("a dog"), tokenizer.vocab_size + 5])
    assert text.startswith("a dog")


# Trains a vocabulary in a fresh interpreter: corpus file, model path, vocab size, cap, seed.
_TRAIN_IN_A_PROCESS = """
import sys
from attnmt.data.tokenizer import train_vocab
corpus, out, size, cap, seed = sys.argv[1:]
texts = open(corpus, encoding="utf-8").read().splitlines()
train_vocab(texts, out, int(size), max_sentences=int(cap), seed=int(seed))
"""


def test_sampled_training_gives_the_same_bytes_in_any_process(tmp_path: Path) -> None:
    """With more sentences than max_sentences (sampling on), two fresh processes and this
    one write byte-identical models for the same input and seed; another seed samples
    otherwise. Without sampling, the whole corpus gives the same bytes too."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(interleave(make_pairs(600, seed=7))) + "\n", encoding="utf-8")
    texts = corpus.read_text(encoding="utf-8").splitlines()
    assert len(texts) == 1200

    def spawn(name: str, cap: int, seed: int = 0) -> tuple[subprocess.Popen, Path]:
        out = tmp_path / name / "v.model"
        args = [str(corpus), str(out), "120", str(cap), str(seed)]
        return subprocess.Popen([sys.executable, "-c", _TRAIN_IN_A_PROCESS, *args]), out

    runs = [spawn("a", 400), spawn("b", 400), spawn("full", 10_000)]
    here = train_vocab(texts, tmp_path / "here" / "v.model", 120, max_sentences=400)
    other_seed = train_vocab(texts, tmp_path / "seed1" / "v.model", 120, max_sentences=400, seed=1)
    full_here = train_vocab(texts, tmp_path / "full_here" / "v.model", 120, max_sentences=10_000)
    for process, _ in runs:
        assert process.wait(timeout=120) == 0
    (_, a), (_, b), (_, full) = runs
    assert a.read_bytes() == b.read_bytes() == here.read_bytes()
    assert a.with_suffix(".vocab").read_bytes() == here.with_suffix(".vocab").read_bytes()
    assert full.read_bytes() == full_here.read_bytes()
    assert other_seed.read_bytes() != here.read_bytes() != full_here.read_bytes()


def test_sample_is_uniform_and_in_corpus_order() -> None:
    """The sentences a capped vocabulary trains on: `size` distinct ones in corpus order,
    each of n sentences in the sample with probability size/n and each pair with
    size(size-1)/(n(n-1)) over seeds (a uniform sample), all of them when n <= size."""
    n, size, seeds = 40, 4, 3000
    assert _sample_sentences(map(str, range(3)), size, 0) == ["0", "1", "2"]
    assert _sample_sentences(map(str, range(size)), size, 0) == [str(i) for i in range(size)]
    single = np.zeros(n)
    pairs = np.zeros((n, n))
    for seed in range(seeds):
        sample = [int(text) for text in _sample_sentences(map(str, range(n)), size, seed)]
        assert len(sample) == size and sample == sorted(set(sample))
        single[sample] += 1
        pairs[np.ix_(sample, sample)] += 1
    # Binomial counts: within 5 standard deviations of the mean, for every sentence / pair.
    p1 = size / n
    assert np.abs(single - seeds * p1).max() < 5 * np.sqrt(seeds * p1 * (1 - p1))
    p2 = size * (size - 1) / (n * (n - 1))
    off_diagonal = pairs[~np.eye(n, dtype=bool)]
    assert np.abs(off_diagonal - seeds * p2).max() < 5 * np.sqrt(seeds * p2 * (1 - p2))
    # Late sentences get in as often as early ones: a reservoir that stopped early would not.
    assert single[n // 2 :].sum() > 0.4 * single.sum()


def test_training_errors(tmp_path: Path) -> None:
    texts = interleave(make_pairs(50))
    with pytest.raises(DataError, match="vocab_size"):
        train_vocab(texts, tmp_path / "v.model", NUM_SPECIAL_TOKENS)
    with pytest.raises(DataError, match="vocab_size"):
        train_vocab(texts, tmp_path / "v.model", 8)  # fewer ids than distinct characters
    with pytest.raises(DataError, match="no non-empty"):
        train_vocab(["", "  "], tmp_path / "v.model", 100)
    assert list(tmp_path.iterdir()) == []  # failed runs leave nothing behind


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"missing\.model"):
        Tokenizer.load(tmp_path / "missing.model")
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(DataError, match=r"bad\.model"):
        Tokenizer.load(bad)
    # A model trained outside attnmt, with sentencepiece's default special ids.
    texts = interleave(make_pairs(50))
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_prefix=str(tmp_path / "other"),
        vocab_size=40,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    with pytest.raises(DataError, match="special ids"):
        Tokenizer.load(tmp_path / "other.model")


def test_whole_words_stay_one_piece_each(tmp_path: Path) -> None:
    """A parsing target's brackets are one piece each, however the rest is split, and the
    tokenizer names them; text with them still decodes to itself."""
    from attnmt.data.prepare import tree_symbols

    pairs = [
        ("the cat sat", "(S (NP XX XX )NP (VP XX )VP )S"),
        ("dogs run fast", "(S (NP XX )NP (VP XX (ADVP XX )ADVP )VP )S"),
    ] * 40
    symbols = tree_symbols(pairs)
    assert symbols == sorted(["(S", ")S", "(NP", ")NP", "(VP", ")VP", "(ADVP", ")ADVP", "XX"])
    texts = [text for pair in pairs for text in pair]
    tokenizer = Tokenizer.load(train_vocab(texts, tmp_path / "v.model", 60, whole_words=symbols))
    tree = "(S (NP XX )NP (VP XX (ADVP XX )ADVP )VP )S"
    ids = tokenizer.encode(tree)
    assert len(ids) == len(tree.split())
    named = tokenizer.whole_words()
    assert [named[i] for i in ids] == tree.split()
    assert sorted(named.values()) == symbols
    assert tokenizer.decode(ids) == tree
    assert tokenizer.decode(tokenizer.encode("the cat sat")) == "the cat sat"


def test_copied_words_are_pieced_as_on_their_own(tmp_path: Path) -> None:
    """With the words as a tree's leaves only the brackets are kept whole, and each word of a
    target tree is split exactly as the word alone is: what the copying tree grammar
    (attnmt.decode.tree_grammar) forces the decoder to write."""
    from attnmt.data.prepare import tree_symbols

    pairs = [
        ("the cat sat", "(S (NP the cat )NP (VP sat )VP )S"),
        ("dogs ran fast", "(S (NP dogs )NP (VP ran (ADVP fast )ADVP )VP )S"),
        ("stray cats", "(NP stray cats )NP"),
    ] * 40
    symbols = tree_symbols(pairs, leaves="words")
    assert symbols == sorted(["(S", ")S", "(NP", ")NP", "(VP", ")VP", "(ADVP", ")ADVP"])
    texts = [text for pair in pairs for text in pair]
    tokenizer = Tokenizer.load(train_vocab(texts, tmp_path / "v.model", 70, whole_words=symbols))
    bracket_ids = {token: i for i, token in tokenizer.whole_words().items()}
    assert sorted(bracket_ids) == symbols
    for tree in ("(S (NP dogs sat )NP (VP cats ran fast )VP )S", "(NP the catsat strays )NP"):
        expected = []
        for token in tree.split():
            expected += [bracket_ids[token]] if token in bracket_ids else tokenizer.encode(token)
        ids = tokenizer.encode(tree)
        assert ids == expected
        assert tokenizer.decode(ids) == tree
    assert len(tokenizer.encode("catsat strays")) > 2  # unseen words take several pieces
