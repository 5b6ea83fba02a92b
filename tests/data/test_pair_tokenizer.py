"""PairTokenizer (imported Marian / opus-mt vocabularies) against sentencepiece itself: the
ids are vocab.json's ids of the pieces sentencepiece returns, a leading language code is
one piece, and text sentencepiece cannot take (lone surrogates) is encoded as U+FFFD."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sentencepiece as spm

from attnmt.common import EOS_ID, UNK_ID
from attnmt.data.pair_tokenizer import PairTokenizer
from tests.helpers import EN, sentences, translation


def _train(lines: list[str], path: Path) -> spm.SentencePieceProcessor:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(path.with_suffix("")),
        vocab_size=40,
        model_type="unigram",
        hard_vocab_limit=False,
        minloglevel=2,
    )
    path.with_suffix(".model").rename(path)
    return spm.SentencePieceProcessor(model_file=str(path))


@pytest.fixture(scope="module")
def folder(
    tmp_path_factory,
) -> tuple[Path, dict[str, int], spm.SentencePieceProcessor, spm.SentencePieceProcessor]:
    out = tmp_path_factory.mktemp("pair")
    source = _train(sentences(EN, 200, 1), out / "source.spm")
    target = _train([translation(s) for s in sentences(EN, 200, 2)], out / "target.spm")
    vocab = {"<pad>": 0, "</s>": 1, "<s>": 2, "<unk>": 3, ">>fra<<": 4}
    for model in (source, target):
        for i in range(model.get_piece_size()):
            vocab.setdefault(model.id_to_piece(i), len(vocab))
    (out / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    return out, vocab, source, target


def _expected(model: spm.SentencePieceProcessor, vocab: dict[str, int], text: str) -> list[int]:
    return [vocab.get(piece, UNK_ID) for piece in model.encode(text, out_type=str)]


def test_ids_are_the_vocabularys_ids_of_sentencepieces_pieces(folder) -> None:
    path, vocab, source, target = folder
    tokenizer = PairTokenizer(path)
    text = "the red dog runs in the park"
    assert tokenizer.encode(text) == _expected(source, vocab, text)
    assert tokenizer.encode(">>fra<<" + text) == [4, *_expected(source, vocab, text)]
    out = translation(text)
    ids = tokenizer.encode_target_batch([out])[0]
    assert ids == _expected(target, vocab, out)
    assert tokenizer.decode([*ids, EOS_ID, *ids]) == out


def test_lone_surrogates_are_encoded_as_the_replacement_character(folder) -> None:
    # UTF-8 cannot hold them, so sentencepiece refuses them; Python strings can (text read
    # with errors="surrogateescape"). The session-40 fix reached this tokenizer too.
    path, vocab, source, target = folder
    tokenizer = PairTokenizer(path)
    texts = ["the \ud800 dog", "\udcff", "a \udfff\ud800 cat"]
    replaced = ["the \ufffd dog", "\ufffd", "a \ufffd\ufffd cat"]
    for text, fixed in zip(texts, replaced, strict=True):
        assert tokenizer.encode(text) == _expected(source, vocab, fixed)
        assert tokenizer.encode(">>fra<<" + text) == [4, *_expected(source, vocab, fixed)]
    batch = tokenizer.encode_target_batch(["a dog", *texts])
    assert batch == [_expected(target, vocab, t) for t in ["a dog", *replaced]]
