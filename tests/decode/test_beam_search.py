"""Decoding tests against brute-force enumeration with tiny second-order Markov "models".

The test model looks up ``logits = table[row, position, prev_token, last_token]``. ``last_token``
is the input; ``position`` (int [rows]), ``prev_token`` (float one-hot [rows, vocab]) and the
table itself (one per sentence) live in the cache, so any mistake in reordering cache rows when
beams are reordered changes the result. A scalar ``step`` leaf checks that 0-d leaves are shared.
The model does not mask PAD/BOS: the decoders themselves must never emit them.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.decode.beam_search import (
    CacheGrowth,
    beam_search,
    doubling_capacities,
    ensemble,
    expand_to_beams,
    greedy_search,
    sample,
)
from tests.decode.search_reference import (
    BOS,
    EOS,
    PAD,
    SHAPES,
    brute_force,
    constant_model,
    fast_jit,
    gnmt_score,
    log_softmax64,
    make_cache,
    random_tables,
    sequence_log_prob,
    strip,
    table_model,
)

# --------------------------------------------------------------------------- test model


# --------------------------------------------------------------------------- references


# --------------------------------------------------------------------------- jitted decoders


@functools.cache
def jit_beam(fn, batch: int, beam: int, length: int):
    # alpha and max_lengths are traced, so one compilation serves every test on this shape.
    return fast_jit(
        functools.partial(beam_search, fn, batch_size=batch, beam_size=beam, max_decode_len=length)
    )


def run_beam(tables, beam, alpha, max_lengths=None, fn=table_model, cache=None):
    batch, length = tables.shape[0], tables.shape[1]
    if max_lengths is None:
        max_lengths = [length] * batch
    cache = make_cache(tables) if cache is None else cache
    seqs, scores = jit_beam(fn, batch, beam, length)(
        expand_to_beams(cache, beam), alpha=alpha, max_lengths=jnp.asarray(max_lengths, jnp.int32)
    )
    return np.asarray(seqs), np.asarray(scores)


def check_against_brute_force(seqs, scores, tables, max_lengths, alpha, log_tables=None):
    """Every returned slot equals the brute-force ranking (which the beam can hold entirely)."""
    log_tables = tables if log_tables is None else log_tables
    beam = seqs.shape[1]
    for b in range(tables.shape[0]):
        expected = brute_force(log_tables[b], max_lengths[b], alpha)[:beam]
        for k, (score, seq) in enumerate(expected):
            assert strip(seqs[b, k]) == seq, (b, k)
            np.testing.assert_allclose(scores[b, k], score, rtol=2e-5, atol=2e-5)
        for k in range(len(expected), beam):  # fewer hypotheses than slots exist
            assert np.isneginf(scores[b, k]) and (seqs[b, k] == PAD).all()


# --------------------------------------------------------------------------- beam search


@pytest.mark.parametrize(("vocab", "length", "beam"), SHAPES)
@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0, -0.5])
def test_wide_beam_equals_brute_force(vocab, length, beam, alpha):
    for seed in range(2):
        tables = random_tables(seed, 3, length, vocab)  # a different table per sentence
        seqs, scores = run_beam(tables, beam, alpha)
        check_against_brute_force(seqs, scores, tables, [length] * 3, alpha)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_max_lengths_per_row(alpha):
    vocab, length, beam = SHAPES[1]
    tables = random_tables(7, 3, length, vocab)
    max_lengths = [3, 2, 4]
    # Row 1 hates EOS before its limit (so it must be forced there), row 2 loves it at once.
    tables[1, : max_lengths[1] - 1, :, :, EOS] -= 20.0
    tables[2, :, :, :, EOS] += 20.0
    seqs, scores = run_beam(tables, beam, alpha, max_lengths)
    check_against_brute_force(seqs, scores, tables, max_lengths, alpha)
    assert len(strip(seqs[1, 0])) == 2  # forced EOS exactly at the limit
    assert strip(seqs[2, 0]) == (EOS,)


def test_finished_hypotheses_are_final():
    vocab, length, beam = SHAPES[1]
    alpha = 0.6
    tables = random_tables(11, 3, length, vocab)
    tables[0, :, :, :, EOS] += 3.0  # row 0 finishes early, rows 1-2 at various steps
    seqs, scores = run_beam(tables, beam, alpha, [4, 3, 4])
    for b, k in itertools.product(range(3), range(beam)):
        row = list(seqs[b, k])
        if np.isneginf(scores[b, k]):
            continue
        end = row.index(EOS)
        assert row.count(EOS) == 1
        assert all(t == PAD for t in row[end + 1 :])  # nothing after EOS
        assert all(t not in (PAD, BOS) for t in row[:end])
        # The recorded score is the score of exactly this sequence: it was not extended or
        # re-scored after finishing.
        seq = tuple(row[: end + 1])
        expected = gnmt_score(sequence_log_prob(tables[b], seq), len(seq), alpha)
        np.testing.assert_allclose(scores[b, k], expected, rtol=2e-5, atol=2e-5)
    for row in scores:  # best first
        finite = row[np.isfinite(row)]
        assert (np.diff(finite) <= 0).all()


def test_expand_to_beams_layout():
    tree = {"x": jnp.arange(6).reshape(2, 3), "shared": jnp.array(7)}
    out = expand_to_beams(tree, 3)
    # rows [b0 beam0, b0 beam1, b0 beam2, b1 beam0, ...]
    np.testing.assert_array_equal(out["x"][:, 0], [0, 0, 0, 3, 3, 3])
    assert out["shared"].ndim == 0


def test_cache_rows_checked():
    tables = random_tables(0, 2, 3, 5)
    with pytest.raises(ValueError, match="leading dimension"):
        beam_search(table_model, make_cache(tables), batch_size=2, beam_size=2, max_decode_len=3)


# --------------------------------------------------------------------------- greedy


def greedy_reference(table: np.ndarray, max_len: int) -> tuple[tuple, float]:
    """Argmax decoding in float64, PAD/BOS excluded, EOS forced at position max_len - 1."""
    logp = log_softmax64(table)
    prev, last, total, seq = PAD, BOS, 0.0, []
    for t in range(max_len):
        allowed = np.full(table.shape[-1], -np.inf)
        keep = [EOS] if t == max_len - 1 else [*range(3, table.shape[-1]), EOS]
        allowed[keep] = logp[t, prev, last, keep]
        tok = int(np.argmax(allowed))
        total, prev, last = total + logp[t, prev, last, tok], last, tok
        seq.append(tok)
        if tok == EOS:
            break
    return tuple(seq), total


@functools.cache
def jit_greedy(fn, batch: int, length: int):
    return fast_jit(functools.partial(greedy_search, fn, batch_size=batch, max_decode_len=length))


def test_greedy_matches_reference_and_beam_one():
    vocab, length = 6, 5
    tables = random_tables(3, 4, length, vocab)
    tables[0, :, :, :, EOS] += 4.0  # rows finish at different steps
    max_lengths = jnp.asarray([5, 5, 3, 1], jnp.int32)
    seqs, logps = jit_greedy(table_model, 4, length)(make_cache(tables), max_lengths=max_lengths)
    seqs, logps = np.asarray(seqs), np.asarray(logps)
    for b in range(4):
        seq, total = greedy_reference(tables[b], int(max_lengths[b]))
        assert strip(seqs[b]) == seq and (seqs[b, len(seq) :] == PAD).all()
        np.testing.assert_allclose(logps[b], total, rtol=1e-5, atol=1e-5)
    # beam_size = 1 without length penalty is greedy decoding. (With alpha > 0 beam search may
    # legitimately keep going after greedy's EOS and find a better-scoring longer hypothesis.)
    beam_seqs, beam_scores = run_beam(tables, 1, 0.0, list(np.asarray(max_lengths)))
    np.testing.assert_array_equal(beam_seqs[:, 0], seqs)
    np.testing.assert_allclose(beam_scores[:, 0], logps, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- ensembles


# One ensemble object for all tests, so that its compiled beam search is reused.
PAIR = ensemble([table_model, table_model])


def test_ensemble_of_identical_models_is_the_model():
    vocab, length, beam = SHAPES[1]
    tables = random_tables(5, 3, length, vocab)
    cache = make_cache(tables)
    single = run_beam(tables, beam, 0.6)
    double = run_beam(tables, beam, 0.6, fn=PAIR, cache=(cache, cache))
    np.testing.assert_array_equal(double[0], single[0])
    np.testing.assert_allclose(double[1], single[1], rtol=1e-5, atol=1e-5)


def test_ensemble_of_different_models_is_log_linear_average():
    vocab, length, beam = SHAPES[1]
    first, second = random_tables(8, 3, length, vocab), random_tables(9, 3, length, vocab)
    cache = (make_cache(first), make_cache(second))
    seqs, scores = run_beam(first, beam, 0.6, fn=PAIR, cache=cache)
    # Reference: the normalised geometric mean of the two distributions, enumerated in float64.
    mean_table = log_softmax64((log_softmax64(first) + log_softmax64(second)) / 2.0)
    check_against_brute_force(seqs, scores, first, [length] * 3, 0.6, log_tables=mean_table)


# --------------------------------------------------------------------------- sampling


def test_sampling_top1_is_greedy_and_deterministic():
    vocab, length = 6, 5
    tables = random_tables(4, 4, length, vocab)
    cache = make_cache(tables)
    greedy = jit_greedy(table_model, 4, length)(cache)
    draw = fast_jit(
        functools.partial(sample, table_model, batch_size=4, max_decode_len=length, top_k=1)
    )
    top1 = draw(cache, jax.random.key(0))
    np.testing.assert_array_equal(top1[0], greedy[0])
    np.testing.assert_allclose(top1[1], greedy[1], rtol=1e-6)
    # temperature 0 is documented as greedy decoding
    zero = sample(
        table_model, cache, jax.random.key(0), batch_size=4, max_decode_len=length, temperature=0.0
    )
    np.testing.assert_array_equal(zero[0], greedy[0])
    with pytest.raises(ValueError, match="temperature"):
        sample(
            table_model,
            cache,
            jax.random.key(0),
            batch_size=4,
            max_decode_len=length,
            temperature=-1.0,
        )


def test_sampling_is_deterministic_for_fixed_rng():
    fn = constant_model(np.array([0.0, 0.5, 0.0, 1.0, 0.2, -0.3]))
    draw = fast_jit(functools.partial(sample, fn, batch_size=64, max_decode_len=6))
    cache = jnp.zeros((64,), jnp.int32)
    a, b = draw(cache, jax.random.key(1)), draw(cache, jax.random.key(1))
    c = draw(cache, jax.random.key(2))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])
    seqs = np.asarray(a[0])
    assert not np.isin(seqs[:, :-1], [BOS]).any()
    for row in seqs:  # every row ends with EOS then pads
        assert list(row).count(EOS) == 1 and (row[list(row).index(EOS) + 1 :] == PAD).all()


@pytest.mark.parametrize(("temperature", "top_k"), [(1.0, 0), (0.5, 0), (2.0, 2)])
def test_sampling_frequencies(temperature, top_k):
    logits = np.array([3.0, 0.3, 3.0, 1.0, 0.0, -0.7])  # PAD/BOS large: must still be excluded
    fn = constant_model(logits)
    n = 4000
    seqs, log_probs = sample(
        fn,
        jnp.zeros((n,), jnp.int32),
        jax.random.key(42),
        batch_size=n,
        max_decode_len=2,
        temperature=temperature,
        top_k=top_k,
    )
    first = np.asarray(seqs)[:, 0]
    allowed = np.array([EOS, 3, 4, 5])
    scaled = logits[allowed] / temperature
    if top_k:
        scaled = np.where(scaled >= np.sort(scaled)[-top_k], scaled, -np.inf)
    expected = np.exp(scaled - scaled.max())
    expected /= expected.sum()
    counts = np.array([(first == t).sum() for t in allowed])
    assert counts.sum() == n  # PAD/BOS never sampled
    assert (counts[expected == 0] == 0).all()
    support = expected > 0
    chi2 = (((counts - n * expected) ** 2)[support] / (n * expected[support])).sum()
    # 3 degrees of freedom at most: P(chi2 > 30) < 1e-5, and the rng is fixed anyway.
    assert chi2 < 30.0, (counts, n * expected)
    # log_probs are under the model (T = 1, full vocabulary), not the sampling distribution.
    model_logp = log_softmax64(logits)
    np.testing.assert_allclose(np.asarray(log_probs)[first == EOS], model_logp[EOS], rtol=1e-5)


# --------------------------------------------------------------------------- early stopping


CALLS: list = []


def counting_model(tokens: jax.Array, cache: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Logits [0, bonus, 0, 0, 0] with bonus = cache [rows]; counts calls via a host callback."""
    jax.debug.callback(lambda: CALLS.append(1))
    logits = jnp.zeros((tokens.shape[0], 5)).at[:, EOS].set(cache)  # [rows, vocab]
    return logits, cache


# Hand trace with beam 4, content tokens {3, 4} at log-prob ~ -20 each step and EOS at ~ 0:
#   step 1: finished {EOS: 0}; live {3, 4} at -20.
#   step 2: finished += {3 EOS, 4 EOS} at -20 / lp(2); only 3 of 4 slots full -> continue.
#           live: the 4 two-token prefixes at -40.
#   step 3: their EOS candidates (-40) rank above all -60 extensions, so one joins the finished
#           set: full, worst = -40 / lp(3). Live beams sit at -60.
#     alpha = 0:   bound -60 <= worst -40 -> done after 3 model calls.
#     alpha = 0.6: lp(3) = (8/6)^0.6 = 1.188, lp(12) = (17/6)^0.6 = 1.867;
#                  bound -60 / 1.867 = -32.1 > worst -40 / 1.188 = -33.7 -> one more step;
#   step 4 (alpha = 0.6): bound -80 / 1.867 = -42.8 <= -33.7 -> done after 4 calls.
@pytest.mark.parametrize(("alpha", "expected_calls"), [(0.0, 3), (0.6, 4)])
def test_beam_search_stops_early(alpha, expected_calls):
    batch, beam, length = 2, 4, 12
    decode = jit_beam(counting_model, batch, beam, length)
    max_lengths = jnp.full((batch,), length, jnp.int32)
    CALLS.clear()
    cache = expand_to_beams(jnp.full((batch,), 20.0), beam)
    seqs, _ = decode(cache, alpha=alpha, max_lengths=max_lengths)
    jax.effects_barrier()
    assert len(CALLS) == expected_calls
    assert (np.asarray(seqs)[:, 0, 0] == EOS).all()
    # Control: a model that never wants EOS runs to the length limit.
    CALLS.clear()
    decode(expand_to_beams(jnp.full((batch,), -20.0), beam), alpha=alpha, max_lengths=max_lengths)
    jax.effects_barrier()
    assert len(CALLS) == length


def test_greedy_stops_when_all_rows_finished():
    CALLS.clear()
    seqs, _ = jit_greedy(counting_model, 3, 10)(jnp.full((3,), 20.0))
    jax.effects_barrier()
    assert len(CALLS) == 1
    assert (np.asarray(seqs)[:, 0] == EOS).all() and (np.asarray(seqs)[:, 1:] == PAD).all()


# --------------------------------------------------------------------------- growing caches


def history_model(tokens: jax.Array, cache: dict) -> tuple[jax.Array, dict]:
    """table_model whose previous token comes from a growable history buffer.

    ``history`` [rows, room] holds the token fed at each step, written at slot ``step`` and
    read back from slot ``step - 1``. Both go through a comparison with the slot index, so
    a buffer without room for the current step silently loses the token (reads PAD) instead
    of clamping, and a grown buffer that moved or dropped a slot changes the logits.
    """
    history, step = cache["history"], cache["step"]
    slots = jnp.arange(history.shape[1])
    prev = jnp.sum(jnp.where(slots == step - 1, history, 0), axis=1)  # [rows], PAD at step 0
    inner = {**cache, "prev": jax.nn.one_hot(prev, cache["table"].shape[-1], dtype=jnp.float32)}
    del inner["history"]
    logits, new_inner = table_model(tokens, inner)
    new_history = jnp.where(slots == step, tokens, history)  # tokens [rows, 1]
    return logits, {**new_inner, "history": new_history}


def grow_history(cache: dict, room: int) -> dict:
    history = cache["history"]
    return {**cache, "history": jnp.pad(history, [(0, 0), (0, room - history.shape[1])])}


def history_cache(tables: np.ndarray, room: int) -> dict:
    cache = make_cache(tables)
    return {**cache, "history": jnp.full((tables.shape[0], room), PAD, jnp.int32)}


def test_doubling_capacities():
    assert doubling_capacities(9, 0) == (9,)
    assert doubling_capacities(9, 9) == (9,)
    assert doubling_capacities(9, 1) == (1, 2, 4, 8, 9)
    assert doubling_capacities(9, 3) == (3, 6, 9)
    assert doubling_capacities(64, 16) == (16, 32, 64)
    assert doubling_capacities(65, 16) == (16, 32, 64, 65)


@functools.cache
def jit_growing_beam(growth: CacheGrowth, batch: int):
    # alpha is traced: one compilation per growth serves both alphas.
    _, length, beam = SHAPES[1]
    return fast_jit(
        functools.partial(
            beam_search,
            history_model,
            batch_size=batch,
            beam_size=beam,
            max_decode_len=length,
            cache_growth=growth,
        )
    )


def growing_beam_search(tables: np.ndarray, growth: CacheGrowth, alpha: float):
    """Beam search of history_model over SHAPES[1]'s beam and length, with ``growth``."""
    beam = SHAPES[1][2]
    cache = expand_to_beams(history_cache(tables, growth.capacities[0]), beam)
    seqs, scores = jit_growing_beam(growth, tables.shape[0])(cache, alpha=alpha)
    return np.asarray(seqs), np.asarray(scores)


@pytest.mark.parametrize("capacities", [(1, 2, 4, 5), (2, 5), (3, 4, 5)])
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_growing_cache_beam_equals_brute_force(capacities, alpha):
    vocab, length, _ = SHAPES[1]
    tables = random_tables(11, 3, length, vocab)
    seqs, scores = growing_beam_search(tables, CacheGrowth(capacities, grow_history), alpha)
    check_against_brute_force(seqs, scores, tables, [length] * 3, alpha)


def test_history_model_needs_the_room_it_is_given():
    # The check above can fail: the same search with a cache that never grows loses tokens.
    vocab, length, _ = SHAPES[1]
    tables = random_tables(11, 3, length, vocab)
    never = CacheGrowth((2, length), lambda cache, room: cache)
    seqs, scores = growing_beam_search(tables, never, 0.0)
    with pytest.raises(AssertionError):
        check_against_brute_force(seqs, scores, tables, [length] * 3, 0.0)


def test_growing_cache_greedy_matches_reference():
    vocab, length = 6, 5
    tables = random_tables(3, 4, length, vocab)
    tables[0, :, :, :, EOS] += 4.0  # rows finish at different steps
    max_lengths = jnp.asarray([5, 5, 3, 1], jnp.int32)
    growth = CacheGrowth((1, 2, 4, 5), grow_history)
    seqs, logps = fast_jit(
        functools.partial(
            greedy_search, history_model, batch_size=4, max_decode_len=length, cache_growth=growth
        )
    )(history_cache(tables, 1), max_lengths=max_lengths)
    for b in range(4):
        seq, total = greedy_reference(tables[b], int(max_lengths[b]))
        assert strip(np.asarray(seqs)[b]) == seq
        np.testing.assert_allclose(np.asarray(logps)[b], total, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("capacities", [(), (0, 5), (2, 2, 5), (2, 4)])
def test_bad_capacities_are_refused(capacities):
    tables = random_tables(0, 1, 5, 5)
    with pytest.raises(ValueError, match="capacities"):
        greedy_search(
            history_model,
            history_cache(tables, 2),
            batch_size=1,
            max_decode_len=5,
            cache_growth=CacheGrowth(capacities, grow_history),
        )
