"""Model-agnostic autoregressive decoding in pure JAX: beam search, greedy, sampling, ensembles.

The model is seen only through a step function::

    tokens_to_logits(tokens, cache) -> (logits, new_cache)

``tokens`` is int32 ``[rows, 1]`` (the last emitted token of every row; ``bos_id`` at the first
step), ``logits`` is float ``[rows, vocab]`` for the next position and ``cache`` is any pytree.

Cache convention: every leaf with ``ndim >= 1`` has leading dimension ``rows`` (one row per
sentence, or per sentence x beam in beam search) and is reordered whenever beams are reordered;
leaves with ``ndim == 0`` (e.g. a decoder position index shared by all rows) are passed through
untouched. For beam search the caller expands the cache to ``batch * beam`` rows with
:func:`expand_to_beams` before calling.

Semantics shared by all decoders:

* Output sequences exclude BOS, include the final EOS and are padded with ``pad_id`` after it.
* ``pad_id`` and ``bos_id`` are never emitted: their log-probabilities are set to -inf *after*
  the log-softmax, so the model needs no masking of its own and the scores stay the model's own
  log-probabilities of the emitted tokens (no renormalisation over the remaining tokens).
* Maximum length: row ``b`` may emit at most ``L_b = min(max_lengths[b], max_decode_len)`` tokens
  (``max_lengths`` clamped to >= 1), *including* EOS. At position ``L_b - 1`` only EOS is allowed,
  so a hypothesis that reaches its row's limit is finished by a forced EOS whose log-probability
  (under the model) is added to its score. Every returned sequence therefore ends in EOS.
* All log-probabilities are computed in float32 whatever the dtype of the logits.

Everything is jit-compatible; each decoder runs one ``lax.while_loop``, so one compilation serves
each (batch, beam, max_decode_len) shape. Integer sizes (``batch_size``, ``beam_size``,
``max_decode_len``, ``top_k``) and ``temperature`` must be static; ``alpha`` may be traced.

Growing caches (optional, :class:`CacheGrowth`): a key/value cache sized for
``max_decode_len`` positions makes every step attend over, and beam search reorder, slots that
most sentences never fill. With ``cache_growth`` the caller creates the cache with room for
``capacities[0]`` positions; the decoder runs one while-loop per capacity and, only when some
sentence is still unfinished at the end of one, calls ``grow(cache, next_capacity)`` and goes on.
Results are the same as with a full-size cache; each capacity is compiled into the same program.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from attnmt.common import BOS_ID, EOS_ID, PAD_ID

PyTree = Any
TokensToLogits = Callable[[jax.Array, PyTree], tuple[jax.Array, PyTree]]
# (prefixes [batch, k, max_decode_len], step, log-probs [batch, k, vocab]) -> the log-probs
# to search with: -inf for tokens that may not come next, others possibly rescored (e.g.
# attnmt.decode.tree_grammar); positions ≥ step of a prefix are unset.
TokenConstraint = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
# The cache after a step (leaves [batch * beam, ...]) -> float [batch * beam]: a term ≤ 0
# added to the score of a hypothesis that finishes at that step from that row (e.g. the
# coverage penalty of attnmt.decode.coverage).
FinishPenalty = Callable[[PyTree], jax.Array]

NEG_INF = float("-inf")

__all__ = [
    "CacheGrowth",
    "FinishPenalty",
    "beam_search",
    "doubling_capacities",
    "ensemble",
    "expand_to_beams",
    "greedy_search",
    "length_penalty",
    "nucleus",
    "sample",
    "top_k_truncated",
]


# --------------------------------------------------------------------------- helpers


def expand_to_beams(tree: PyTree, beam_size: int) -> PyTree:
    """Repeats every leaf with ``ndim >= 1`` ``beam_size`` times along axis 0.

    A leaf of shape ``[batch, ...]`` becomes ``[batch * beam_size, ...]`` with rows ordered
    ``[b0 beam0, b0 beam1, ..., b0 beam(K-1), b1 beam0, ...]`` (row ``b * beam_size + k``), the
    layout :func:`beam_search` expects. Scalar leaves are shared by all rows and left as they are.
    Use it on the encoder output/mask and the initial decoder cache before calling beam search.
    """
    return jax.tree.map(lambda x: jnp.repeat(x, beam_size, axis=0) if jnp.ndim(x) >= 1 else x, tree)


def length_penalty(length: jax.Array | int, alpha: jax.Array | float) -> jax.Array:
    """GNMT length penalty ``lp(Y) = ((5 + |Y|) / 6) ** alpha`` (Wu et al. 2016, eq. 14).

    ``|Y|`` is the number of emitted tokens *including* the final EOS (BOS and padding excluded).
    Some toolkits (fairseq's ``--lenpen``, Marian's ``--normalize``) divide by ``|Y| ** alpha``
    instead; the two rank hypotheses differently, so scores are not comparable across them.
    """
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


class CacheGrowth(NamedTuple):
    """How a decoder enlarges its cache (module docstring, "Growing caches").

    ``capacities``: strictly increasing positions of room, the last equal to ``max_decode_len``;
    the cache passed in has room for ``capacities[0]``. ``grow(cache, n)`` returns the cache with
    room for ``n`` positions, every filled slot kept where it was.
    """

    capacities: tuple[int, ...]
    grow: Callable[[PyTree, int], PyTree]


def doubling_capacities(max_decode_len: int, initial: int) -> tuple[int, ...]:
    """``(initial, 2·initial, 4·initial, ..., max_decode_len)``; ``initial <= 0`` = one size."""
    if initial <= 0 or initial >= max_decode_len:
        return (max_decode_len,)
    capacities = [initial]
    while 2 * capacities[-1] < max_decode_len:
        capacities.append(2 * capacities[-1])
    return (*capacities, max_decode_len)


def _check_growth(growth: CacheGrowth | None, max_decode_len: int) -> tuple[int, ...]:
    if growth is None:
        return (max_decode_len,)
    capacities = tuple(int(c) for c in growth.capacities)
    increasing = all(a < b for a, b in itertools.pairwise(capacities))
    if not capacities or capacities[0] < 1 or not increasing or capacities[-1] != max_decode_len:
        raise ValueError(
            f"cache_growth.capacities must increase strictly from >= 1 to max_decode_len = "
            f"{max_decode_len}, got {capacities}"
        )
    return capacities


def _run_until_done(
    state: Any, body: Callable[[Any], Any], capacities: tuple[int, ...], growth: CacheGrowth | None
) -> Any:
    """Runs ``body`` while some sentence is unfinished, one while-loop per cache capacity.

    ``state`` is a NamedTuple with ``step``, ``done`` and ``cache``; the returned state has
    ``cache=None`` (the decoders never return it), which is what lets the branch that skips
    the remaining capacities and the branch that grows the cache return the same structure.
    """

    def run_from(level: int, s: Any) -> Any:
        capacity = capacities[level]
        s = lax.while_loop(lambda s: (s.step < capacity) & ~jnp.all(s.done), body, s)
        if level == len(capacities) - 1:
            return s._replace(cache=None)

        def grow_and_continue(s: Any) -> Any:
            grown = growth.grow(s.cache, capacities[level + 1])
            return run_from(level + 1, s._replace(cache=grown))

        return lax.cond(jnp.all(s.done), lambda s: s._replace(cache=None), grow_and_continue, s)

    return run_from(0, state)


def _check_cache_rows(cache: PyTree, rows: int, what: str) -> None:
    # Shapes are static, so a mis-expanded cache fails here with a readable message instead of
    # as a broadcasting error deep inside the model.
    for path, leaf in jax.tree_util.tree_leaves_with_path(cache):
        if jnp.ndim(leaf) >= 1 and jnp.shape(leaf)[0] != rows:
            raise ValueError(
                f"cache leaf {jax.tree_util.keystr(path)} has leading dimension "
                f"{jnp.shape(leaf)[0]}, expected {rows} ({what})"
            )


def _row_max_lengths(
    max_lengths: jax.Array | None, batch_size: int, max_decode_len: int
) -> jax.Array:
    """Per-sentence length limits (EOS included), clamped to [1, max_decode_len]. # [batch]"""
    if max_lengths is None:
        return jnp.full((batch_size,), max_decode_len, jnp.int32)
    return jnp.clip(jnp.asarray(max_lengths, jnp.int32), 1, max_decode_len)


def _step_log_probs(
    logits: jax.Array, step: jax.Array, row_max: jax.Array, ids: tuple[int, int, int]
) -> jax.Array:
    """float32 log-probabilities for the token at position ``step``, masked for decoding.

    logits: [rows, vocab]; row_max: [rows] per-row length limit. PAD/BOS get -inf (never emitted);
    rows at their last allowed position may only emit EOS (forced finish).
    """
    eos_id, bos_id, pad_id = ids
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [rows, vocab]
    vocab_ids = jnp.arange(logp.shape[-1])  # [vocab]
    banned = (vocab_ids == pad_id) | (vocab_ids == bos_id)  # [vocab]
    at_limit = (step >= row_max - 1)[:, None]  # [rows, 1]
    banned = banned[None, :] | (at_limit & (vocab_ids != eos_id)[None, :])  # [rows, vocab]
    return jnp.where(banned, NEG_INF, logp)


def _gather_rows(tree: PyTree, beam_idx: jax.Array, old_beam: int) -> PyTree:
    """Reorders cache rows: new row (b, j) <- old row (b, beam_idx[b, j]).

    beam_idx: [batch, new_beam] indices into the ``old_beam`` beams of the same sentence. One
    ``take`` per leaf; scalar leaves are shared and not gathered.
    """
    batch = beam_idx.shape[0]
    rows = (jnp.arange(batch)[:, None] * old_beam + beam_idx).reshape(-1)  # [batch * new_beam]
    return jax.tree.map(lambda x: jnp.take(x, rows, axis=0) if jnp.ndim(x) >= 1 else x, tree)


def _gather_beams(x: jax.Array, beam_idx: jax.Array) -> jax.Array:
    """x: [batch, beam, ...], beam_idx: [batch, new_beam] -> [batch, new_beam, ...]."""
    idx = beam_idx.reshape(beam_idx.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)


# --------------------------------------------------------------------------- beam search


class _BeamState(NamedTuple):
    step: jax.Array  # [] number of tokens emitted so far
    last_tok: jax.Array  # [batch, beam] token fed to the model next
    live_seqs: jax.Array  # [batch, beam, max_decode_len]
    live_logp: jax.Array  # [batch, beam] log P(prefix); -inf = empty/dead slot
    fin_seqs: jax.Array  # [batch, beam, max_decode_len] sorted best first
    fin_scores: jax.Array  # [batch, beam] log P(Y) / lp(|Y|); -inf = empty slot
    fin_logp: jax.Array  # [batch, beam] log P(Y) of the same hypotheses; -inf = empty slot
    done: jax.Array  # [batch] no live hypothesis can still enter the top-k finished
    cache: PyTree  # leaves [batch * beam, ...] (or scalars)


def _extend_candidates(
    state: _BeamState, logp: jax.Array, beam_size: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Top 2K one-token extensions of the live beams: (logp, seqs, source beam).

    logp: [batch, beam, vocab]. Returns [batch, 2K], [batch, 2K, max_decode_len], [batch, 2K].
    2K candidates guarantee at least K non-EOS ones (each beam contributes one EOS at most).
    """
    batch, _, vocab = logp.shape
    total = state.live_logp[:, :, None] + logp  # [batch, beam, vocab]
    cand_logp, flat_idx = lax.top_k(total.reshape(batch, beam_size * vocab), 2 * beam_size)
    cand_beam = flat_idx // vocab  # [batch, 2K]
    cand_tok = (flat_idx % vocab).astype(jnp.int32)  # [batch, 2K]
    cand_seqs = _gather_beams(state.live_seqs, cand_beam)  # [batch, 2K, max_decode_len]
    positions = jnp.arange(cand_seqs.shape[-1])  # [max_decode_len]
    cand_seqs = jnp.where(positions == state.step, cand_tok[:, :, None], cand_seqs)
    return cand_logp, cand_seqs, cand_beam


def _select_finished(
    state: _BeamState,
    cand_logp: jax.Array,
    cand_seqs: jax.Array,
    cand_is_eos: jax.Array,
    alpha: jax.Array,
    cand_penalty: jax.Array | float = 0.0,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Merges this step's EOS candidates into the finished top-K: (seqs, scores, logp).

    ``cand_penalty`` [batch, 2K] (≤ 0) is added to the score of each EOS candidate."""
    beam_size = state.fin_scores.shape[1]
    # As in fairseq/OpenNMT an EOS candidate is accepted only if it ranks within the top K of
    # this step's candidates, which makes beam_size=1 coincide with greedy decoding.
    in_top_k = jnp.arange(2 * beam_size) < beam_size  # [2K]
    penalty = length_penalty(state.step + 1, alpha)  # |Y| of a hypothesis finishing now
    finishing = cand_is_eos & in_top_k
    cand_scores = jnp.where(finishing, cand_logp / penalty + cand_penalty, NEG_INF)  # [batch, 2K]
    # Existing entries come first so that on ties top_k (lower index first) keeps them.
    all_scores = jnp.concatenate([state.fin_scores, cand_scores], axis=1)  # [batch, 3K]
    all_seqs = jnp.concatenate([state.fin_seqs, cand_seqs], axis=1)  # [batch, 3K, max_len]
    fin_scores, fin_idx = lax.top_k(all_scores, beam_size)  # [batch, beam]
    # The raw log-probabilities travel with the scores (not recovered as score * lp, which
    # would round twice); entries whose score is -inf are empty slots, so -inf there too.
    cand_logp = jnp.where(jnp.isneginf(cand_scores), NEG_INF, cand_logp)
    all_logp = jnp.concatenate([state.fin_logp, cand_logp], axis=1)  # [batch, 3K]
    fin_logp = jnp.take_along_axis(all_logp, fin_idx, axis=1)  # [batch, beam]
    return _gather_beams(all_seqs, fin_idx), fin_scores, fin_logp


def _sentence_done(
    live_logp: jax.Array,
    fin_scores: jax.Array,
    new_len: jax.Array,
    row_max: jax.Array,
    alpha: jax.Array,
) -> jax.Array:
    """[batch] True where no live beam can still beat the worst finished hypothesis.

    A live prefix with log-prob l <= 0 can only lose probability, so its best final score is
    l / max lp(n) over the reachable lengths n in [new_len + 1, L_b]. lp is monotone in n
    (increasing for alpha >= 0, decreasing for alpha < 0), so the max is at one end. Dividing by
    the *largest* penalty is the optimistic choice because l is negative. A finish penalty
    (:data:`FinishPenalty`) is ≤ 0, so it can only lower a final score: the bound holds with
    it as it is. Empty finished slots (-inf) keep a sentence running while any beam is
    alive; dead beams (-inf) never do.
    """
    best_lp = jnp.maximum(length_penalty(new_len + 1, alpha), length_penalty(row_max, alpha))
    bound = jnp.max(live_logp, axis=1) / best_lp  # [batch]
    return bound <= jnp.min(fin_scores, axis=1)


def _beam_step(
    state: _BeamState,
    tokens_to_logits: TokensToLogits,
    row_max: jax.Array,
    alpha: jax.Array,
    ids: tuple[int, int, int],
    constraint: TokenConstraint | None,
    finish_penalty: FinishPenalty | None = None,
) -> _BeamState:
    batch, beam_size, _ = state.live_seqs.shape
    logits, cache = tokens_to_logits(state.last_tok.reshape(batch * beam_size, 1), state.cache)
    row_max_rows = jnp.repeat(row_max, beam_size)  # [batch * beam]
    logp = _step_log_probs(logits, state.step, row_max_rows, ids)
    logp = logp.reshape(batch, beam_size, -1)  # [batch, beam, vocab]
    if constraint is not None:
        logp = constraint(state.live_seqs, state.step, logp)
    cand_logp, cand_seqs, cand_beam = _extend_candidates(state, logp, beam_size)
    cand_is_eos = cand_seqs[:, :, state.step] == ids[0]  # [batch, 2K]
    cand_penalty = 0.0
    if finish_penalty is not None:
        # A candidate finishing now takes the penalty of the row it extends, after this step.
        by_row = finish_penalty(cache).astype(jnp.float32).reshape(batch, beam_size)
        cand_penalty = jnp.take_along_axis(by_row, cand_beam, axis=1)  # [batch, 2K]
    fin_seqs, fin_scores, fin_logp = _select_finished(
        state, cand_logp, cand_seqs, cand_is_eos, alpha, cand_penalty
    )

    # Live: the best K non-EOS candidates; finished hypotheses are never extended.
    live_cand = jnp.where(cand_is_eos, NEG_INF, cand_logp)  # [batch, 2K]
    live_logp, live_idx = lax.top_k(live_cand, beam_size)  # [batch, beam]
    live_seqs = _gather_beams(cand_seqs, live_idx)  # [batch, beam, max_len]
    cache = _gather_rows(cache, jnp.take_along_axis(cand_beam, live_idx, axis=1), beam_size)

    new_len = state.step + 1
    done = state.done | _sentence_done(live_logp, fin_scores, new_len, row_max, alpha)
    # Kill the live beams of done sentences so that nothing about them can change any more.
    live_logp = jnp.where(done[:, None], NEG_INF, live_logp)
    last_tok = live_seqs[:, :, state.step]  # [batch, beam]
    return _BeamState(
        new_len, last_tok, live_seqs, live_logp, fin_seqs, fin_scores, fin_logp, done, cache
    )


def beam_search(
    tokens_to_logits: TokensToLogits,
    cache: PyTree,
    *,
    batch_size: int,
    beam_size: int,
    max_decode_len: int,
    alpha: float | jax.Array = 0.6,
    eos_id: int = EOS_ID,
    bos_id: int = BOS_ID,
    pad_id: int = PAD_ID,
    max_lengths: jax.Array | None = None,
    cache_growth: CacheGrowth | None = None,
    constraint: TokenConstraint | None = None,
    finish_penalty: FinishPenalty | None = None,
    return_log_probs: bool = False,
) -> tuple[jax.Array, ...]:
    """Beam search with the GNMT length penalty and exact early stopping.

    ``cache`` is already expanded to ``batch_size * beam_size`` rows by :func:`expand_to_beams`.
    A hypothesis scores ``log P(Y) / lp(|Y|)`` (:func:`length_penalty`; ``|Y|`` counts the
    emitted tokens including EOS; ``alpha = 0`` ranks by log-probability). ``max_lengths``
    ([batch], optional; the paper uses input length + 50) bounds ``|Y|`` per sentence, with a
    forced EOS at the limit (module docstring).

    Each step extends every live beam by every token and keeps the top ``2 * beam_size``
    candidates; EOS candidates ranked within the top ``beam_size`` join the finished set (the
    best ``beam_size`` by score), the best ``beam_size`` non-EOS ones become the live beams. A
    sentence is done when no live beam can beat its worst finished hypothesis (bound: live
    log-prob / the largest reachable length penalty); the loop stops when all sentences are done
    or after ``max_decode_len`` steps. ``cache_growth``: see :class:`CacheGrowth`.
    ``constraint`` bans (or rescores) tokens per beam and step (:data:`TokenConstraint`); the
    log-probabilities of the tokens left are not renormalised. ``finish_penalty``
    (:data:`FinishPenalty`) adds a term ≤ 0 to a finishing hypothesis's score, read from its
    row of the cache after the step that emits its EOS; the live beams are still ranked by
    log-probability alone, as the length penalty leaves them.

    Returns ``sequences`` int32 ``[batch, beam, max_decode_len]`` (best first) and ``scores``
    float32 ``[batch, beam]``; with ``return_log_probs`` also ``log_probs`` float32
    ``[batch, beam]``, each hypothesis's raw ``log P(Y)`` (sum of its tokens' log-probabilities,
    no length penalty). The ``beam_size`` finished hypotheses are the n-best list: its first
    ``K`` entries are the top-``K``. Slots for which no hypothesis exists (tiny search spaces)
    have score and log-prob -inf and all-``pad_id`` sequences.
    """
    rows = batch_size * beam_size
    _check_cache_rows(cache, rows, f"batch_size * beam_size = {batch_size} * {beam_size}")
    capacities = _check_growth(cache_growth, max_decode_len)
    row_max = _row_max_lengths(max_lengths, batch_size, max_decode_len)  # [batch]
    alpha = jnp.asarray(alpha, jnp.float32)
    state = _initial_beam_state(cache, batch_size, beam_size, max_decode_len, (bos_id, pad_id))

    def body(s: _BeamState) -> _BeamState:
        ids = (eos_id, bos_id, pad_id)
        return _beam_step(s, tokens_to_logits, row_max, alpha, ids, constraint, finish_penalty)

    final = _run_until_done(state, body, capacities, cache_growth)
    sequences, scores = _finished_hypotheses(final, pad_id)
    if return_log_probs:
        return sequences, scores, final.fin_logp
    return sequences, scores


def _initial_beam_state(
    cache: PyTree, batch_size: int, beam_size: int, max_decode_len: int, ids: tuple[int, int]
) -> _BeamState:
    """The search before its first step; ``ids`` = (bos_id, pad_id)."""
    bos_id, pad_id = ids
    shape = (batch_size, beam_size)
    # All beams start as the same empty prefix; only beam 0 is alive so that the first step does
    # not produce beam_size copies of every candidate.
    live_logp = jnp.full(shape, NEG_INF, jnp.float32).at[:, 0].set(0.0)
    return _BeamState(
        step=jnp.array(0, jnp.int32),
        last_tok=jnp.full(shape, bos_id, jnp.int32),
        live_seqs=jnp.full((*shape, max_decode_len), pad_id, jnp.int32),
        live_logp=live_logp,
        fin_seqs=jnp.full((*shape, max_decode_len), pad_id, jnp.int32),
        fin_scores=jnp.full(shape, NEG_INF, jnp.float32),
        fin_logp=jnp.full(shape, NEG_INF, jnp.float32),
        done=jnp.zeros((batch_size,), bool),
        cache=cache,
    )


def _finished_hypotheses(final: _BeamState, pad_id: int) -> tuple[jax.Array, jax.Array]:
    """(sequences [batch, beam, max_decode_len], scores [batch, beam]) of the finished set;
    an empty slot (score -inf) gets an all-``pad_id`` sequence."""
    empty = jnp.isneginf(final.fin_scores)[:, :, None]  # [batch, beam, 1]
    sequences = jnp.where(empty, pad_id, final.fin_seqs)  # [batch, beam, max_decode_len]
    return sequences, final.fin_scores


# --------------------------------------------------------------------------- greedy / sampling


class _SingleState(NamedTuple):
    step: jax.Array  # []
    last_tok: jax.Array  # [batch]
    seqs: jax.Array  # [batch, max_decode_len]
    log_probs: jax.Array  # [batch] log P of the emitted tokens under the model
    done: jax.Array  # [batch] emitted EOS already
    cache: PyTree  # leaves [batch, ...] (or scalars)


def _single_path_decode(
    tokens_to_logits: TokensToLogits,
    cache: PyTree,
    choose: Callable[[jax.Array, jax.Array], jax.Array],
    sizes: tuple[int, int],
    ids: tuple[int, int, int],
    max_lengths: jax.Array | None,
    cache_growth: CacheGrowth | None,
    constraint: TokenConstraint | None = None,
) -> tuple[jax.Array, jax.Array]:
    """One hypothesis per row; ``choose(log_probs [batch, vocab], step) -> tokens [batch]``."""
    (batch_size, max_decode_len), (eos_id, bos_id, pad_id) = sizes, ids
    _check_cache_rows(cache, batch_size, f"batch_size = {batch_size}")
    capacities = _check_growth(cache_growth, max_decode_len)
    row_max = _row_max_lengths(max_lengths, batch_size, max_decode_len)  # [batch]
    state = _SingleState(
        step=jnp.array(0, jnp.int32),
        last_tok=jnp.full((batch_size,), bos_id, jnp.int32),
        seqs=jnp.full((batch_size, max_decode_len), pad_id, jnp.int32),
        log_probs=jnp.zeros((batch_size,), jnp.float32),
        done=jnp.zeros((batch_size,), bool),
        cache=cache,
    )

    def body(s: _SingleState) -> _SingleState:
        logits, new_cache = tokens_to_logits(s.last_tok[:, None], s.cache)
        logp = _step_log_probs(logits, s.step, row_max, ids)  # [batch, vocab]
        if constraint is not None:
            logp = constraint(s.seqs[:, None], s.step, logp[:, None])[:, 0]
        tok = choose(logp, s.step).astype(jnp.int32)  # [batch]
        tok = jnp.where(s.done, pad_id, tok)  # finished rows only pad
        tok_logp = jnp.take_along_axis(logp, tok[:, None], axis=1)[:, 0]  # [batch]
        log_probs = s.log_probs + jnp.where(s.done, 0.0, tok_logp)
        seqs = s.seqs.at[:, s.step].set(tok)
        return _SingleState(s.step + 1, tok, seqs, log_probs, s.done | (tok == eos_id), new_cache)

    final = _run_until_done(state, body, capacities, cache_growth)
    return final.seqs, final.log_probs


def greedy_search(
    tokens_to_logits: TokensToLogits,
    cache: PyTree,
    *,
    batch_size: int,
    max_decode_len: int,
    eos_id: int = EOS_ID,
    bos_id: int = BOS_ID,
    pad_id: int = PAD_ID,
    max_lengths: jax.Array | None = None,
    cache_growth: CacheGrowth | None = None,
    constraint: TokenConstraint | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Greedy (argmax) decoding; stops as soon as every row has emitted EOS.

    ``cache`` has ``batch_size`` rows. Returns ``sequences`` int32 ``[batch, max_decode_len]``
    (EOS included, ``pad_id`` after it) and ``log_probs`` float32 ``[batch]``: the model's
    log-probability of the sequence, without length penalty. Length limits and
    ``cache_growth`` and ``constraint`` as in beam search.
    """

    def choose(logp: jax.Array, step: jax.Array) -> jax.Array:
        return jnp.argmax(logp, axis=-1)

    sizes, ids = (batch_size, max_decode_len), (eos_id, bos_id, pad_id)
    return _single_path_decode(
        tokens_to_logits, cache, choose, sizes, ids, max_lengths, cache_growth, constraint
    )


def sample(
    tokens_to_logits: TokensToLogits,
    cache: PyTree,
    rng: jax.Array,
    *,
    batch_size: int,
    max_decode_len: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    epsilon: float = 0.0,
    eos_id: int = EOS_ID,
    bos_id: int = BOS_ID,
    pad_id: int = PAD_ID,
    max_lengths: jax.Array | None = None,
    cache_growth: CacheGrowth | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Ancestral sampling from ``softmax(logits / temperature)``, optionally top-k/top-p truncated.

    PAD/BOS are excluded and the distribution renormalised over the remaining tokens; with
    ``top_k > 0`` only the ``top_k`` most likely tokens (ties at the k-th value included) are kept.
    With ``top_p < 1`` (nucleus sampling, Holtzman et al. 2020), applied after ``top_k`` to the
    renormalised distribution, only the smallest set of most likely tokens whose probability
    reaches ``top_p`` is kept, plus every token tied with the least likely one kept (so the set
    does not depend on the order of equal probabilities); the kept tokens are renormalised.
    With ``epsilon > 0`` (epsilon sampling, Hewitt et al. 2022), applied last, tokens whose
    probability under that distribution is below ``epsilon`` are dropped too, except the most
    likely one. None of the three sorts the vocabulary (:func:`_largest_passing`).
    ``temperature == 0`` means greedy decoding (delegates to :func:`greedy_search`); a negative
    temperature or top_k, ``top_p`` outside ``(0, 1]`` or ``epsilon`` outside ``[0, 1)``
    raises ``ValueError``. ``temperature``, ``top_k``, ``top_p`` and ``epsilon`` are static
    Python numbers.
    The randomness of step ``t`` is ``fold_in(rng, t)``, so results depend only on ``rng``.
    ``rng`` is one key for the whole batch, or one key per row (``[batch]`` typed keys or
    ``[batch, 2]`` raw ones): then each row's sample depends only on its own key, not on the
    other rows of the batch or their number.

    Returns ``sequences`` int32 ``[batch, max_decode_len]`` and ``log_probs`` float32 ``[batch]``,
    the log-probability of the sample under the *model* (temperature 1, no truncation), so that
    samples can be compared with beam/greedy outputs.
    """
    _check_sampling(temperature, top_k, top_p, epsilon)
    if temperature == 0:
        kwargs = dict(
            eos_id=eos_id,
            bos_id=bos_id,
            pad_id=pad_id,
            max_lengths=max_lengths,
            cache_growth=cache_growth,
        )
        return greedy_search(
            tokens_to_logits, cache, batch_size=batch_size, max_decode_len=max_decode_len, **kwargs
        )

    choose = _sampler(rng, batch_size, temperature, top_k, top_p, epsilon)
    sizes, ids = (batch_size, max_decode_len), (eos_id, bos_id, pad_id)
    return _single_path_decode(
        tokens_to_logits, cache, choose, sizes, ids, max_lengths, cache_growth
    )


def _check_sampling(temperature: float, top_k: int, top_p: float, epsilon: float) -> None:
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = full distribution), got {top_k}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1 = full distribution), got {top_p}")
    if not 0 <= epsilon < 1:
        raise ValueError(f"epsilon must be in [0, 1) (0 = off), got {epsilon}")


def nucleus(logits: jax.Array, top_p: float) -> jax.Array:
    """``logits`` [rows, vocab] with -inf outside each row's top-p nucleus (see :func:`sample`).

    The nucleus is the fewest most likely tokens whose probability reaches ``top_p``, plus
    every token tied with the least likely of them: all tokens of probability ≥ v, for the
    largest v with mass(p ≥ v) ≥ top_p. That v is found without sorting the vocabulary
    (:func:`_largest_passing`); a row whose whole mass rounds below ``top_p`` keeps every token.
    """
    # [rows, vocab] float32 (the keys below are 32-bit patterns); -inf logits give 0
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    # Non-negative float32s order as their bit patterns do (the sign bit is 0).
    keys = lax.bitcast_convert_type(probs, jnp.uint32)

    def reaches(kept: jax.Array) -> jax.Array:
        return jnp.sum(jnp.where(kept, probs, 0.0), axis=-1, keepdims=True) >= top_p

    least = _largest_passing(keys, reaches, bits=31)  # [rows, 1]
    return jnp.where(keys >= least, logits, NEG_INF)


def top_k_truncated(logits: jax.Array, top_k: int) -> jax.Array:
    """``logits`` [rows, vocab] with -inf below each row's ``top_k``-th largest value (ties
    with it kept), found without sorting (:func:`_largest_passing`)."""
    # -0.0 and +0.0 are equal as floats but not as bit patterns: make them one.
    keys = _ordered_keys(jnp.where(logits == 0, 0.0, logits))

    def enough(kept: jax.Array) -> jax.Array:
        return jnp.sum(kept, axis=-1, keepdims=True, dtype=jnp.int32) >= top_k

    kth = _largest_passing(keys, enough, bits=32)  # [rows, 1]
    return jnp.where(keys >= kth, logits, NEG_INF)


def _ordered_keys(x: jax.Array) -> jax.Array:
    """float32 → uint32 with the floats' order (-inf lowest): negative floats' bits are
    complemented (a larger magnitude is smaller), non-negative ones get the top bit."""
    bits = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(1 << 31))


def _largest_passing(
    keys: jax.Array, passes: Callable[[jax.Array], jax.Array], bits: int
) -> jax.Array:
    """The largest t < 2**bits (uint32, [rows, 1]) for which ``passes(keys >= t)`` holds, 0
    when none does. ``passes`` must be monotone (true up to some t, false above), as a count
    or a mass of the keys ≥ t is; t is set bit by bit from the highest, one masked reduction
    over the vocabulary per bit, where a sort would cost O(vocab · log vocab) per row."""

    def next_bit(i: jax.Array, t: jax.Array) -> jax.Array:
        candidate = t | jnp.left_shift(jnp.uint32(1), (bits - 1 - i).astype(jnp.uint32))
        return jnp.where(passes(keys >= candidate), candidate, t)

    start = jnp.zeros((*keys.shape[:-1], 1), jnp.uint32)
    return lax.fori_loop(0, bits, next_bit, start)


def epsilon_truncated(logits: jax.Array, epsilon: float) -> jax.Array:
    """``logits`` [rows, vocab] with -inf where a token's probability is below ``epsilon``,
    the most likely token of each row always kept (see :func:`sample`)."""
    probs = jax.nn.softmax(logits, axis=-1)
    floor = jnp.minimum(epsilon, jnp.max(probs, axis=-1, keepdims=True))
    return jnp.where(probs >= floor, logits, NEG_INF)


def _sampler(
    rng: jax.Array,
    batch_size: int,
    temperature: float,
    top_k: int,
    top_p: float = 1.0,
    epsilon: float = 0.0,
) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """`choose(log_probs [batch, vocab], step) -> tokens [batch]` for :func:`sample`."""
    typed = jnp.issubdtype(rng.dtype, jax.dtypes.prng_key)
    per_row = rng.ndim == (1 if typed else 2)
    if per_row and rng.shape[0] != batch_size:
        raise ValueError(f"{rng.shape[0]} row keys for batch_size = {batch_size}")

    def draw(key: jax.Array, logits: jax.Array, step: jax.Array) -> jax.Array:
        return jax.random.categorical(jax.random.fold_in(key, step), logits, axis=-1)

    def choose(logp: jax.Array, step: jax.Array) -> jax.Array:
        # log_softmax(logits) / T differs from logits / T by a per-row constant, so sampling from
        # it is sampling from softmax(logits / T); masked tokens stay at -inf.
        scaled = logp / temperature  # [batch, vocab]
        if 0 < top_k < scaled.shape[-1]:
            scaled = top_k_truncated(scaled, top_k)
        if top_p < 1:
            scaled = nucleus(scaled, top_p)
        if epsilon > 0:
            scaled = epsilon_truncated(scaled, epsilon)
        if per_row:
            return jax.vmap(draw, in_axes=(0, 0, None))(rng, scaled, step)
        return draw(rng, scaled, step)

    return choose


# --------------------------------------------------------------------------- ensembles


def ensemble(fns: Sequence[TokensToLogits]) -> TokensToLogits:
    """Combines several step functions into one (log-linear ensemble).

    The combined cache is a tuple with one cache per member (so the beam-search row convention
    holds for it automatically) and the output is ``log_softmax(mean_i log_softmax(logits_i))``:
    the renormalised geometric mean of the members' distributions. The output is already
    normalised, so the decoders' own log-softmax leaves it unchanged. Averaging probabilities
    instead (a linear mixture) is the other common choice; it is not what this does.
    """
    fns = tuple(fns)
    if not fns:
        raise ValueError("ensemble() needs at least one model")

    def combined(tokens: jax.Array, cache: tuple[PyTree, ...]) -> tuple[jax.Array, tuple]:
        if len(cache) != len(fns):
            raise ValueError(f"ensemble of {len(fns)} models got {len(cache)} caches")
        log_probs, new_caches = [], []
        for fn, member_cache in zip(fns, cache, strict=True):
            logits, new_cache = fn(tokens, member_cache)
            log_probs.append(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1))
            new_caches.append(new_cache)
        mean = jnp.mean(jnp.stack(log_probs), axis=0)  # [rows, vocab]
        return jax.nn.log_softmax(mean, axis=-1), tuple(new_caches)

    return combined
