"""GNMT's coverage penalty for beam search (Wu et al. 2016, eq. 14).

A finished hypothesis Y of source X scores ``log P(Y|X) / lp(|Y|) + cp(X; Y)`` with

    cp(X; Y) = β · Σ_i log(min(Σ_j p_ij, 1))

where ``p_ij`` is the attention the j-th output token (EOS included) paid to source token i:
a source token the output never attended to costs the hypothesis, one attended to in total
at least once costs nothing. A Transformer has many attention distributions per output
token; this takes the encoder-decoder attention of the last decoder layer, averaged over
its heads (as OpenNMT-py does for its Transformer), over the source's real tokens (its EOS
included, padding excluded). A sum that underflowed to 0 counts as float32's smallest
normal number, so that no hypothesis scores -inf (which beam search reads as "no
hypothesis"). cp ≤ 0, so beam search's early stop stays exact with it
(attnmt.decode.beam_search.FinishPenalty).

The search carries each row's running sum ``Σ_j p_ij`` in its cache, under the key
:data:`COVERAGE_KEY`, where beam search reorders it with the rest of the cache.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from attnmt.common import PAD_ID
from attnmt.decode.beam_search import FinishPenalty, expand_to_beams

COVERAGE_KEY = "coverage"

__all__ = ["COVERAGE_KEY", "coverage_penalty", "finish_penalty", "last_cross_attention"]


def last_cross_attention(intermediates: Any, decoder_layers: int) -> jax.Array:
    """[rows, src_len] float32: the last decoder layer's encoder-decoder attention of one
    decoding step, averaged over heads, from the "intermediates" a per-layer model sowed."""
    sown = intermediates[f"decoder_{decoder_layers - 1}"]["cross_attention"]
    weights = sown["attention_weights"][0]  # [rows, heads, 1, src_len] (decode: heads major)
    return jnp.mean(weights[:, :, 0, :].astype(jnp.float32), axis=1)


def coverage_penalty(coverage: jax.Array, real: jax.Array, beta: float) -> jax.Array:
    """cp = β Σ_i log(min(coverage_i, 1)) over the positions where `real` is true.

    coverage: [rows, src_len] attention summed over the output tokens; real: [rows, src_len]
    bool. Returns float32 [rows], ≤ 0 for β ≥ 0.
    """
    tiny = jnp.finfo(jnp.float32).tiny
    capped = jnp.clip(coverage.astype(jnp.float32), tiny, 1.0)
    return beta * jnp.sum(jnp.where(real, jnp.log(capped), 0.0), axis=-1)


def finish_penalty(src_tokens: jax.Array, beam_size: int, beta: float) -> FinishPenalty:
    """Beam search's FinishPenalty for the sources `src_tokens` [batch, src_len] (PAD-padded)
    searched with `beam_size`: cp of the coverage the cache carries; an ensemble's cache
    holds one per model, and their mean is what is penalised."""
    real = expand_to_beams(src_tokens, beam_size) != PAD_ID  # [batch × beam, src_len]

    def penalty(cache: Any) -> jax.Array:
        found = [
            leaf
            for path, leaf in jax.tree_util.tree_leaves_with_path(cache)
            if getattr(path[-1], "key", None) == COVERAGE_KEY
        ]
        if not found:
            raise ValueError(f"no {COVERAGE_KEY!r} entry in the search's cache")
        return coverage_penalty(sum(found) / len(found), real, beta)

    return penalty
