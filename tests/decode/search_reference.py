"""The tiny decoding "models" and float64 references the search tests share.

The table model looks up ``logits = table[row, position, prev_token, last_token]``. ``last_token``
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

from attnmt.config.xla import compiler_options

PAD, EOS, BOS = 0, 1, 2
# XLA's backend at optimisation level 0 compiles the searches about twice as fast; the
# float64 references bound the results, not the compiled code's speed.
fast_jit = functools.partial(jax.jit, compiler_options=compiler_options(0))


def table_model(tokens: jax.Array, cache: dict) -> tuple[jax.Array, dict]:
    table = cache["table"]  # [rows, length, vocab(prev), vocab(last), vocab(next)]
    rows = table.shape[0]
    pos = jnp.minimum(cache["pos"], table.shape[1] - 1)  # [rows]
    last = tokens[:, 0]  # [rows]
    by_prev = table[jnp.arange(rows), pos, :, last]  # [rows, vocab(prev), vocab(next)]
    logits = jnp.einsum("rp,rpv->rv", cache["prev"], by_prev)  # [rows, vocab]
    new_cache = {
        "table": table,
        "pos": cache["pos"] + 1,
        "prev": jax.nn.one_hot(last, table.shape[-1], dtype=jnp.float32),
        "step": cache["step"] + 1,
    }
    return logits, new_cache


def make_cache(tables: np.ndarray) -> dict:
    """tables: [batch, length, vocab, vocab, vocab] -> cache with ``batch`` rows."""
    batch, vocab = tables.shape[0], tables.shape[-1]
    return {
        "table": jnp.asarray(tables, jnp.float32),
        "pos": jnp.zeros((batch,), jnp.int32),
        "prev": jax.nn.one_hot(jnp.full((batch,), PAD), vocab, dtype=jnp.float32),
        "step": jnp.array(0, jnp.int32),
    }


def random_tables(seed: int, batch: int, length: int, vocab: int) -> np.ndarray:
    # Scale 2 gives peaked but not degenerate distributions, so hypotheses rarely tie.
    return np.random.default_rng(seed).normal(0.0, 2.0, (batch, length, vocab, vocab, vocab))


def log_softmax64(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def sequence_log_prob(table: np.ndarray, seq: tuple[int, ...], logp=None) -> float:
    """float64 log P(seq) under one sentence's table (seq excludes BOS, includes EOS);
    `logp`: the table's log_softmax64, when the caller has it already."""
    logp = log_softmax64(table) if logp is None else logp
    prev, last, total = PAD, BOS, 0.0
    for t, tok in enumerate(seq):
        total += logp[t, prev, last, tok]
        prev, last = last, tok
    return total


def gnmt_score(log_prob: float, length: int, alpha: float) -> float:
    return log_prob / ((5.0 + length) / 6.0) ** alpha


def brute_force(table: np.ndarray, max_len: int, alpha: float) -> list[tuple[float, tuple]]:
    """All sequences of <= max_len tokens ending in EOS (no PAD/BOS), best first."""
    content = range(3, table.shape[-1])
    logp = log_softmax64(table)
    results = []
    for m in range(max_len):
        for body in itertools.product(content, repeat=m):
            seq = (*body, EOS)
            score = gnmt_score(sequence_log_prob(table, seq, logp), len(seq), alpha)
            results.append((score, seq))
    return sorted(results, key=lambda r: -r[0])


def strip(row: np.ndarray) -> tuple[int, ...]:
    """Tokens up to and including the first EOS."""
    row = list(row)
    return tuple(row[: row.index(EOS) + 1]) if EOS in row else tuple(row)


# (vocab, length, beam) with C = vocab - 3 content tokens. Beam search is exhaustive when the
# beam holds every candidate of every step: beam >= (C + 1) * C^t for t <= length - 2 (EOS is
# only accepted from the top beam_size candidates of a step) and beam >= C^(length - 1) (live
# prefixes at the forced-EOS step). Then it must return exactly the brute-force top-k. Case 1
# has 15 sequences for 16 slots (one empty slot); case 2 has 31 sequences for 24 slots
# (truncation, so the early-stop bound decides when sentences finish).
SHAPES = [(5, 4, 16), (5, 5, 24)]


def constant_model(logits: np.ndarray):
    """Same next-token logits at every step and row; the cache is a per-row counter."""
    row = jnp.asarray(logits, jnp.float32)

    def fn(tokens, cache):
        return jnp.broadcast_to(row, (tokens.shape[0], row.shape[0])), cache + 1

    return fn


# A first step's logits for the samplers' tests: PAD and BOS are the most likely, so a
# sampler that does not exclude them shows it at once.
SAMPLER_LOGITS = np.array([3.0, 0.3, 3.0, 1.0, 0.0, -0.7, 0.5, 1.4])
SAMPLER_ALLOWED = np.array([EOS, 3, 4, 5, 6, 7])


def tempered_first_token(temperature: float, top_k: int) -> np.ndarray:
    """float64 distribution over SAMPLER_ALLOWED (PAD/BOS removed) of softmax(logits / T),
    restricted to the top_k most likely (0 = all) and renormalised."""
    scaled = SAMPLER_LOGITS[SAMPLER_ALLOWED] / temperature
    if top_k:
        scaled = np.where(scaled >= np.sort(scaled)[-top_k], scaled, -np.inf)
    probs = np.exp(scaled - scaled.max())
    return probs / probs.sum()


def check_sampler_frequencies(seed: int, expected: np.ndarray, **sampling) -> None:
    """4,000 first tokens drawn by beam_search.sample(**sampling) from
    constant_model(SAMPLER_LOGITS) against `expected`, a float64 distribution over
    SAMPLER_ALLOWED: nothing outside its support ever, a chi-square test inside it, and
    log_probs the model's own (T = 1, no truncation)."""
    from attnmt.decode.beam_search import sample

    n = 4000
    seqs, log_probs = sample(
        constant_model(SAMPLER_LOGITS),
        jnp.zeros((n,), jnp.int32),
        jax.random.key(seed),
        batch_size=n,
        max_decode_len=2,
        **sampling,
    )
    first = np.asarray(seqs)[:, 0]
    assert 2 <= (expected > 0).sum() < len(SAMPLER_ALLOWED)  # the case truncates, and samples
    counts = np.array([(first == t).sum() for t in SAMPLER_ALLOWED])
    assert counts.sum() == n and not np.isin(first, [PAD, BOS]).any()
    assert (counts[expected == 0] == 0).all()
    support = expected > 0
    chi2 = (((counts - n * expected) ** 2)[support] / (n * expected[support])).sum()
    # ≤ 4 degrees of freedom: P(chi2 > 30) < 1e-5 for a correct sampler (the key is fixed).
    assert chi2 < 30.0, (counts, n * expected)
    model_logp = jax.nn.log_softmax(jnp.asarray(SAMPLER_LOGITS))
    eos_rows = np.asarray(log_probs)[first == EOS]
    np.testing.assert_allclose(eos_rows, float(model_logp[EOS]), rtol=1e-5)


def nucleus_reference(probs: np.ndarray, top_p: float) -> np.ndarray:
    """float64: the fewest most likely tokens whose probability reaches top_p, plus every
    token tied with the least likely of them; the kept ones renormalised."""
    order = np.argsort(-probs, kind="stable")
    total, least = 0.0, None
    for token in order:
        if total >= top_p:
            break
        total += probs[token]
        least = probs[token]
    kept = np.where(probs >= least, probs, 0.0)
    return kept / kept.sum()
