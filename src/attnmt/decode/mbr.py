"""Minimum Bayes-risk (MBR) choice among a beam's finished hypotheses.

Beam search returns the hypothesis the model scores highest; MBR returns the one the
others agree with most: with candidates h_1..h_K (the beam's n-best list) and weights w_j
(the model's probabilities renormalised over the list, or uniform), the choice is

    argmax_i  Σ_j w_j · u(h_i, h_j)

where u is a sentence-level metric (sacrebleu's sentence BLEU with effective order, or
chrF) of h_i against h_j taken as the reference. Texts that appear more than once (two
segmentations of one string) are one candidate carrying their summed weight. Ties go to
the candidate the beam ranked first.

A beam's few hypotheses are the head of the model's distribution, not samples of it; given
S samples s_1..s_S drawn from the model for the same input (decode.mbr_samples), the
pseudo-references become a mixture: the beam's hypotheses with weights (1 - share) · w_j and
each sample with share / S (a Monte Carlo estimate of the rest of the distribution), while
the candidates stay the beam's (samples are noisier outputs than the beam's; as candidates
too they gained nothing on validation: docs/REPRODUCING.md "Minimum Bayes risk against
samples").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from sacrebleu.metrics import BLEU, CHRF

from attnmt.config.decode import MbrUtility, MbrWeights


def sentence_utility(name: MbrUtility) -> Callable[[str, str], float]:
    """u(hypothesis, pseudo-reference), 0-100."""
    if name == "bleu":
        metric = BLEU(effective_order=True)
    elif name == "chrf":
        metric = CHRF()
    else:
        raise ValueError(f"unknown MBR utility {name!r}: 'bleu' or 'chrf'")
    return lambda hypothesis, reference: metric.sentence_score(hypothesis, [reference]).score


def candidate_weights(log_probs: Sequence[float], weights: MbrWeights) -> np.ndarray:
    """One weight per candidate, summing to 1: a candidate without a finite log-probability
    (a beam slot nothing filled, an empty input) gets 0; all 0 when none has one."""
    values = np.asarray(log_probs, np.float64)
    finite = np.isfinite(values)
    if not finite.any():
        return np.zeros(len(values))
    if weights == "uniform":
        raw = finite.astype(np.float64)
    elif weights == "model":
        raw = np.where(finite, np.exp(values - values[finite].max()), 0.0)
    else:
        raise ValueError(f"unknown MBR weighting {weights!r}: 'model' or 'uniform'")
    return raw / raw.sum()


def mbr_index(
    texts: Sequence[str],
    log_probs: Sequence[float],
    utility: Callable[[str, str], float],
    weights: MbrWeights = "model",
    samples: Sequence[str] = (),
    sample_share: float = 0.5,
) -> int:
    """The index (into `texts`, best-first as the beam ranked them) of the MBR choice; with
    `samples`, they carry `sample_share` of the pseudo-references' weight (module docstring)."""
    if not 0 <= sample_share <= 1:
        raise ValueError(f"sample_share must be in [0, 1], got {sample_share}")
    weight = candidate_weights(log_probs, weights)
    merged: dict[str, float] = {}
    first: dict[str, int] = {}
    for index, (text, w) in enumerate(zip(texts, weight, strict=True)):
        if w > 0:
            merged[text] = merged.get(text, 0.0) + float(w)
            first.setdefault(text, index)
    if len(merged) <= 1:
        return next(iter(first.values()), 0)
    distinct = list(merged)
    references = dict(merged)
    if samples:
        references = {text: (1 - sample_share) * w for text, w in merged.items()}
        for text in samples:
            references[text] = references.get(text, 0.0) + sample_share / len(samples)
    gains = np.array(
        [sum(w * utility(h, r) for r, w in references.items() if w > 0) for h in distinct],
        np.float64,
    )
    # Gains equal up to the rounding of their sums count as ties, which keep the candidate
    # the beam ranked higher (the order of `distinct`).
    best = int(np.argmax(gains >= gains.max() - 1e-9 * max(1.0, abs(gains.max()))))
    return first[distinct[best]]
