"""GNMT's coverage penalty (attnmt.decode.coverage): beam search with it against a float64
brute force on a tiny table model, and on a real two-layer model every finished score against
log P(Y) / lp(|Y|) + β Σ_i log min(Σ_j p_ij, 1) recomputed from one teacher-forced forward
pass (the last layer's attention maps as attention inspection captures them)."""

from __future__ import annotations

import functools
import itertools
import math
from types import SimpleNamespace

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.common import EOS_ID, PAD_ID
from attnmt.config.decode import DecodeConfig
from attnmt.decode.beam_search import beam_search, expand_to_beams
from attnmt.decode.coverage import COVERAGE_KEY, finish_penalty
from attnmt.decode.evaluation import decodes_stem
from attnmt.decode.translate import decode_batch
from attnmt.errors import ConfigError
from attnmt.inspection.capture import attention_maps
from attnmt.model.transformer import Transformer
from tests.decode.search_reference import (
    BOS,
    EOS,
    SHAPES,
    fast_jit,
    gnmt_score,
    log_softmax64,
    make_cache,
    random_tables,
    sequence_log_prob,
    strip,
    table_model,
)
from tests.helpers import tiny_experiment

SOURCE = 3  # source positions of the table model's "attention"


def coverage64(attention: np.ndarray, fed: tuple[int, ...], beta: float) -> float:
    """β Σ_i log min(Σ_j p_ij, 1) in float64; attention[token] is the distribution a step
    fed `token` pays over the source, `fed` the tokens fed at the hypothesis's steps."""
    covered = np.sum([attention[token] for token in fed], axis=0)
    return beta * float(np.sum(np.log(np.minimum(covered, 1.0))))


def attending_model(tokens: jax.Array, cache: dict) -> tuple[jax.Array, dict]:
    """table_model whose step fed token t also adds attention[row, t] to its coverage."""
    logits, inner = table_model(tokens, cache["inner"])
    attention = cache["attention"]  # [rows, vocab, SOURCE]
    paid = attention[jnp.arange(tokens.shape[0]), tokens[:, 0]]  # [rows, SOURCE]
    updated = {"inner": inner, "attention": attention, COVERAGE_KEY: cache[COVERAGE_KEY] + paid}
    return logits, updated


def attention_tables(seed: int, batch: int, vocab: int) -> np.ndarray:
    # Peaked rows (scale 3) leave some source position nearly unattended by most tokens,
    # so which tokens a hypothesis uses changes its penalty by whole units.
    logits = np.random.default_rng(seed).normal(0.0, 3.0, (batch, vocab, SOURCE))
    return np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)


def brute_force_covered(table, attention, max_len, alpha, beta):
    """Every sequence of ≤ max_len tokens ending in EOS, best first by the penalised score."""
    logp = log_softmax64(table)
    results = []
    for m in range(max_len):
        for body in itertools.product(range(3, table.shape[-1]), repeat=m):
            seq = (*body, EOS)
            score = gnmt_score(sequence_log_prob(table, seq, logp), len(seq), alpha)
            results.append((score + coverage64(attention, (BOS, *body), beta), seq))
    return sorted(results, key=lambda r: -r[0])


@functools.cache
def jit_covered(batch: int, beam: int, length: int, beta: float):
    sources = jnp.ones((batch, SOURCE), jnp.int32)  # every position real
    return fast_jit(
        functools.partial(
            beam_search,
            attending_model,
            batch_size=batch,
            beam_size=beam,
            max_decode_len=length,
            finish_penalty=finish_penalty(sources, beam, beta),
        )
    )


@pytest.mark.parametrize(("vocab", "length", "beam"), SHAPES)
@pytest.mark.parametrize(("alpha", "beta"), [(0.0, 0.4), (0.6, 0.2), (0.6, 2.0)])
def test_wide_beam_with_coverage_equals_brute_force(vocab, length, beam, alpha, beta):
    # A beam this wide holds every hypothesis (search_reference.SHAPES), and the penalty is
    # ≤ 0, so exact early stopping still lets the search return the brute-force top-K.
    tables, attention = random_tables(5, 3, length, vocab), attention_tables(5, 3, vocab)
    cache = {
        "inner": make_cache(tables),
        "attention": jnp.asarray(attention, jnp.float32),
        COVERAGE_KEY: jnp.zeros((3, SOURCE), jnp.float32),
    }
    seqs, scores = jit_covered(3, beam, length, beta)(expand_to_beams(cache, beam), alpha=alpha)
    moved = 0
    for b in range(3):
        expected = brute_force_covered(tables[b], attention[b], length, alpha, beta)[:beam]
        for k, (score, seq) in enumerate(expected):
            assert strip(np.asarray(seqs[b, k])) == seq, (b, k)
            np.testing.assert_allclose(scores[b, k], score, rtol=2e-5, atol=2e-5)
        plain = brute_force_covered(tables[b], attention[b], length, alpha, 0.0)[:beam]
        moved += [seq for _, seq in plain] != [seq for _, seq in expected]
    assert moved >= 1  # the penalty reorders some sentence's hypotheses here


# --------------------------------------------------------------------------- a real model


@pytest.fixture(scope="module")
def two_layer_model():
    experiment = tiny_experiment(
        [
            "--config.model.vocab_size=24",
            "--config.model.d_model=16",
            "--config.model.d_ff=32",
            "--config.model.d_k=8",
            "--config.model.d_v=8",
            "--config.model.num_heads=2",
            "--config.model.num_layers=2",
            "--config.model.max_length=24",
        ]
    )
    config = experiment.model
    example = jnp.ones((1, 8), jnp.int32)
    params = Transformer(config).init(jax.random.PRNGKey(3), example, example)["params"]
    return config, nn.meta.unbox(params)


def teacher_forced(config, params, src: np.ndarray, ids: list[int]) -> tuple[float, np.ndarray]:
    """(float64 log P(ids | src), the last decoder layer's head-averaged attention on the
    source [len(ids), src_len]) from one full forward pass."""
    model = Transformer(config)
    tgt = np.asarray([ids], np.int32)
    logits = model.apply({"params": params}, src[None], tgt)
    logp = log_softmax64(np.asarray(logits[0], np.float64))
    maps = attention_maps(model, params, src[None], tgt)
    last = maps[f"decoder_{config.decoder_layers - 1}/cross_attention"][0]  # [heads, q, k]
    attention = np.asarray(last, np.float64).mean(axis=0)
    return float(sum(logp[t, token] for t, token in enumerate(ids))), attention


def test_model_scores_carry_the_coverage_penalty_of_the_last_layer(two_layer_model):
    config, params = two_layer_model
    beam, alpha, beta = 4, 0.6, 0.5
    rng = np.random.default_rng(0)
    src = rng.integers(3, config.vocab_size, (3, 7)).astype(np.int32)
    src[:, -1] = EOS_ID
    src[1, 4:] = PAD_ID  # a shorter source: padding is not counted as uncovered
    src[1, 3] = EOS_ID
    hypotheses = decode_batch(
        [config], [params], jnp.asarray(src), beam_size=beam, alpha=alpha, max_len_offset=5,
        max_positions=config.max_length, nbest=beam, coverage_penalty=beta,
    )  # fmt: skip
    sequences, scores, log_probs = (np.asarray(x) for x in hypotheses)
    penalties = []
    for b, k in itertools.product(range(3), range(beam)):
        ids = [int(t) for t in sequences[b, k] if t != PAD_ID]
        real = src[b][src[b] != PAD_ID]
        log_prob, attention = teacher_forced(config, params, real, ids)
        covered = attention.sum(axis=0)  # over the |Y| output positions, EOS's included
        penalty = beta * float(np.sum(np.log(np.minimum(covered, 1.0))))
        penalties.append(penalty)
        # Cached vs full forward pass: float32 rounding of O(1) sums per token (test_nbest),
        # and of each attention weight, relative, inside the log of each source position.
        assert abs(log_probs[b, k] - log_prob) <= 1e-4 * len(ids), (b, k)
        lp = ((5.0 + len(ids)) / 6.0) ** alpha
        tolerance = 1e-4 * len(ids) / lp + beta * len(real) * 1e-4
        assert abs(scores[b, k] - (log_prob / lp + penalty)) <= tolerance, (b, k)
        assert scores[b, :].tolist() == sorted(scores[b, :].tolist(), reverse=True)
    assert min(penalties) < -0.01  # the penalty is not vacuous on these sentences


def test_coverage_off_or_greedy_leaves_the_search_as_it_was(two_layer_model):
    config, params = two_layer_model
    src = jnp.asarray([[5, 9, 7, 11, EOS_ID], [4, 8, EOS_ID, PAD_ID, PAD_ID]], jnp.int32)
    search = functools.partial(
        decode_batch, [config], [params], src, alpha=0.6, max_len_offset=5,
        max_positions=config.max_length,
    )  # fmt: skip
    for beam in (1, 3):
        plain = search(beam_size=beam)
        np.testing.assert_array_equal(plain, search(beam_size=beam, coverage_penalty=0.0))
    np.testing.assert_array_equal(search(beam_size=1), search(beam_size=1, coverage_penalty=0.7))


# --------------------------------------------------------------------------- settings


def test_negative_beta_is_refused_by_key():
    with pytest.raises(ConfigError, match=r"decode\.coverage_penalty"):
        DecodeConfig(coverage_penalty=-0.1)


@pytest.mark.parametrize(
    ("own", "asked", "suffix"),
    [
        ({}, {}, ""),
        ({}, {"coverage_penalty": 0.2}, "-cov0.2"),
        ({"coverage_penalty": 0.2}, {}, "-cov0"),
    ],
)
def test_decodes_file_names_a_coverage_penalty_not_the_runs_own(own, asked, suffix):
    run = SimpleNamespace(experiment=SimpleNamespace(decode=DecodeConfig(**own)), step=7)
    assert decodes_stem("val", run, DecodeConfig(**asked)) == f"val-step7-beam4{suffix}"


def test_underflowed_coverage_stays_finite():
    # A source token no step attended to at all would make log 0 = -inf, which the search
    # reads as an empty slot; it costs β log(float32's smallest normal) instead.
    src = jnp.ones((1, 2), jnp.int32)
    penalty = finish_penalty(src, 1, 1.0)({COVERAGE_KEY: jnp.asarray([[0.0, 2.0]])})
    assert float(penalty[0]) == pytest.approx(math.log(np.finfo(np.float32).tiny), rel=1e-6)
