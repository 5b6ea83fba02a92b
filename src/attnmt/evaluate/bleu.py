"""BLEU as the paper and Multi30K report it: SacreBLEU, tokenized BLEU and Multi30K BLEU.

Three conventions, all computed by sacrebleu (corpus-level, one reference per segment):

* :func:`sacre_bleu` -- the reproducible standard: detokenized input, sacrebleu's default
  ``13a`` tokenizer, cased. Report this with its signature.
* :func:`tokenized_bleu` -- what "Attention Is All You Need" reports (Table 2): Moses-tokenize
  both sides and, for English-German, split hyphenated compounds into
  ``word ##AT##-##AT## word`` the way tensor2tensor's ``get_ende_bleu.sh`` does, then BLEU on the
  tokens as they are. Numbers are comparable with the paper, not with SacreBLEU.
* :func:`multi30k_bleu` -- the Multi30K convention: references are the official lowercased,
  punctuation-normalised, Moses-tokenized ``tok/*.lc.norm.tok.*`` lines; hypotheses get the same
  preprocessing.

This module deliberately has no JAX dependency: it runs on plain strings.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU

from attnmt.data.text_form import lc_norm_tok, moses_tokenizer
from attnmt.errors import DataError

__all__ = [
    "BleuResult",
    "multi30k_bleu",
    "multi30k_tokenize",
    "sacre_bleu",
    "split_compounds_atat",
    "tokenized_bleu",
]

# tensor2tensor get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'. Python's re.sub
# scans left to right without overlaps exactly like Perl's /g, so "a-b-c" becomes
# "a ##AT##-##AT## b-c" in both (the second hyphen's left neighbour was consumed); we keep that
# quirk on purpose so that numbers stay comparable with the published ones.
_ATAT = re.compile(r"(\S)-(\S)")


@dataclass(frozen=True)
class BleuResult:
    """A corpus BLEU score with everything needed to report it.

    ``score`` and ``precisions`` (1- to 4-gram, in percent) are on the 0-100 scale;
    ``signature`` says how the number was computed and must be reported along with it.
    """

    score: float
    signature: str
    precisions: tuple[float, ...]
    brevity_penalty: float
    sys_len: int
    ref_len: int

    def format(self, *, width: int = 2) -> str:
        """sacrebleu-style one-liner, e.g. ``BLEU = 27.30 58.1/33.0/21.0/13.9 (BP = ...) sig``."""
        precisions = "/".join(f"{p:.1f}" for p in self.precisions)
        ratio = self.sys_len / self.ref_len if self.ref_len else 0.0
        return (
            f"BLEU = {self.score:.{width}f} {precisions} (BP = {self.brevity_penalty:.3f} "
            f"ratio = {ratio:.3f} hyp_len = {self.sys_len} ref_len = {self.ref_len}) "
            f"{self.signature}"
        )

    def __str__(self) -> str:
        return self.format()


def _check_pairs(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if isinstance(hypotheses, str) or isinstance(references, str):
        # A bare string would silently be scored character by character.
        raise TypeError("hypotheses and references must be sequences of strings, not a string")
    if len(hypotheses) != len(references):
        raise DataError(
            f"BLEU needs one reference per hypothesis: got {len(hypotheses)} hypotheses and "
            f"{len(references)} references"
        )


def _corpus_bleu(
    hypotheses: Sequence[str], references: Sequence[str], metric: BLEU, prefix: str = ""
) -> BleuResult:
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return BleuResult(
        score=float(result.score),
        # The signature is only defined after scoring (it records the number of references).
        signature=prefix + str(metric.get_signature()),
        precisions=tuple(float(p) for p in result.precisions),
        brevity_penalty=float(result.bp),
        sys_len=int(result.sys_len),
        ref_len=int(result.ref_len),
    )


def sacre_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> BleuResult:
    """SacreBLEU with its defaults: detokenized text, 13a tokenizer, cased, exp smoothing."""
    _check_pairs(hypotheses, references)
    return _corpus_bleu(hypotheses, references, BLEU())


def split_compounds_atat(line: str) -> str:
    """tensor2tensor compound splitting: ``Vorstands-Chef`` -> ``Vorstands ##AT##-##AT## Chef``.

    Any hyphen with a non-space character on both sides is split (``(\\S)-(\\S)`` as in
    ``get_ende_bleu.sh``), applied to already Moses-tokenized text.
    """
    return _ATAT.sub(r"\1 ##AT##-##AT## \2", line)


def tokenized_bleu(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    lang: str,
    split_compounds: bool | None = None,
    lowercase: bool = False,
) -> BleuResult:
    """The paper's tokenized BLEU (``multi-bleu.perl`` on Moses tokens), via sacrebleu.

    Both sides are Moses-tokenized for ``lang`` (sacremoses, no XML escaping: escaping maps
    tokens one-to-one and so cannot change BLEU); with ``split_compounds`` (default: only for
    ``lang == "de"``, as in tensor2tensor's ``get_ende_bleu.sh``) hyphenated compounds are split
    by :func:`split_compounds_atat`. BLEU is then computed on the tokens as they are
    (``tokenize='none'``). Unlike ``multi-bleu.perl``, sacrebleu smooths zero n-gram counts
    (``smooth:exp``), which only matters for tiny or degenerate corpora.
    """
    _check_pairs(hypotheses, references)
    if split_compounds is None:
        split_compounds = lang == "de"
    tokenizer = moses_tokenizer(lang)

    def prepare(line: str) -> str:
        tokens = tokenizer.tokenize(line, escape=False, return_str=True)
        return split_compounds_atat(tokens) if split_compounds else tokens

    hyps = [prepare(h) for h in hypotheses]
    refs = [prepare(r) for r in references]
    metric = BLEU(tokenize="none", force=True, lowercase=lowercase)
    split = "atat" if split_compounds else "no"
    prefix = f"tokenized-bleu|moses:{lang}|escape:no|compound-split:{split}|"
    return _corpus_bleu(hyps, refs, metric, prefix)


def multi30k_tokenize(lines: Sequence[str], *, lang: str) -> list[str]:
    """Reproduces the Multi30K ``tok/*.lc.norm.tok.<lang>`` preprocessing (with XML
    escaping, as the official files have it: attnmt.data.text_form.lc_norm_tok)."""
    return [lc_norm_tok(line, lang) for line in lines]


def multi30k_bleu(
    hypotheses: Sequence[str], references_tok: Sequence[str], *, lang: str
) -> BleuResult:
    """BLEU under the Multi30K convention (lowercased, normalised, Moses-tokenized).

    ``hypotheses`` are detokenized system outputs; they are preprocessed by
    :func:`multi30k_tokenize`. ``references_tok`` are lines of the official
    ``tok/<split>.lc.norm.tok.<lang>`` file, used as they are.
    """
    _check_pairs(hypotheses, references_tok)
    hyps = multi30k_tokenize(hypotheses, lang=lang)
    refs = [r.strip() for r in references_tok]
    metric = BLEU(tokenize="none", force=True)
    prefix = f"multi30k-bleu|lc|norm-punct:{lang}|moses:{lang}|escape:yes|"
    return _corpus_bleu(hyps, refs, metric, prefix)
