"""The form of the text a model trains and translates on: raw, or Multi30K's ``lc.norm.tok``.

Published Multi30K results train on the official ``tok/*.lc.norm.tok.*`` files: lowercased,
punctuation-normalised and Moses-tokenized with XML escaping. With ``data.text_form =
"lc.norm.tok"`` a run does the same from any source: both sides of every training and
validation pair take that form before the vocabulary is trained and the splits tokenized;
at translation a source sentence takes it before it is encoded, and a hypothesis is
detokenized (unescaped, still lowercase) after it is decoded, so translations and scores
are read from plain text as for any other run.

No JAX here: plain strings (sacremoses).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

from attnmt.config.data import DataConfig

RAW = "raw"
LC_NORM_TOK = "lc.norm.tok"


@functools.cache
def moses_tokenizer(lang: str) -> MosesTokenizer:
    # Building one compiles dozens of regexes; one per language is reused.
    return MosesTokenizer(lang=lang)


@functools.cache
def _moses_normalizer(lang: str) -> MosesPunctNormalizer:
    return MosesPunctNormalizer(lang=lang)


@functools.cache
def _moses_detokenizer(lang: str) -> MosesDetokenizer:
    return MosesDetokenizer(lang=lang)


def lc_norm_tok(line: str, lang: str) -> str:
    """One line as the official Multi30K files have it.

    They were made with ``lowercase.perl | normalize-punctuation.perl -l <lang> |
    tokenizer.perl -l <lang>``, i.e. *with* the tokenizer's default XML escaping (``'``
    becomes ``&apos;``). The Perl scripts see each line with its newline, which one
    normalisation rule (moving ``"`` before a final ``.`` for non-English text) depends on,
    so the newline is added for normalisation and stripped afterwards.
    """
    normalized = _moses_normalizer(lang).normalize(line.lower() + "\n").strip()
    return moses_tokenizer(lang).tokenize(normalized, escape=True, return_str=True)


def detokenize(line: str, lang: str) -> str:
    """Moses-detokenized and unescaped: the inverse of the tokenization in lc_norm_tok."""
    return _moses_detokenizer(lang).detokenize(line.split(), unescape=True)


@dataclass(frozen=True)
class TextForm:
    """How a run's text is prepared (``form``: RAW or LC_NORM_TOK) for its two languages."""

    form: str = RAW
    src_lang: str = "en"
    tgt_lang: str = "de"

    @classmethod
    def of(cls, data: DataConfig) -> TextForm:
        """The form a run's data section asks for."""
        return cls(data.text_form, data.src_lang, data.tgt_lang)

    @property
    def is_raw(self) -> bool:
        return self.form == RAW

    def pairs(self, pairs: Iterable[tuple[str, str]]) -> Iterator[tuple[str, str]]:
        """Training or validation pairs in this form (streamed)."""
        if self.is_raw:
            yield from pairs
            return
        for src, tgt in pairs:
            yield lc_norm_tok(src, self.src_lang), lc_norm_tok(tgt, self.tgt_lang)

    def source(self, line: str) -> str:
        """A sentence to translate, in the form the model was trained on."""
        return line if self.is_raw or not line.strip() else lc_norm_tok(line, self.src_lang)

    def target(self, line: str) -> str:
        """A target sentence (a given translation) in the form the model was trained on."""
        return line if self.is_raw or not line.strip() else lc_norm_tok(line, self.tgt_lang)

    def output(self, text: str) -> str:
        """A decoded hypothesis as plain text (detokenized when the model emits tokens)."""
        return text if self.is_raw or not text else detokenize(text, self.tgt_lang)
