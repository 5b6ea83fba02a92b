"""Nucleus (top-p) sampling: the kept set against a float64 reference (ties included),
empirical frequencies against the truncated distribution, and the setting reaching the
command line and the translator."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.cli.main import main
from attnmt.config.decode import DecodeConfig
from attnmt.decode.beam_search import nucleus, sample
from attnmt.errors import ConfigError
from tests.decode.search_reference import BOS, EOS, PAD, constant_model, fast_jit
from tests.helpers import translate_lines


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


@pytest.mark.parametrize(
    ("probs", "top_p", "kept"),
    [
        ([0.5, 0.3, 0.15, 0.05], 0.75, [0, 1]),
        ([0.5, 0.3, 0.15, 0.05], 0.85, [0, 1, 2]),
        ([0.5, 0.3, 0.15, 0.05], 0.3, [0]),
        ([0.5, 0.3, 0.15, 0.05], 1.0, [0, 1, 2, 3]),
        ([0.05, 0.15, 0.5, 0.3], 0.75, [2, 3]),  # order of the vocabulary does not matter
        # Ties with the least likely kept token are kept, whichever order they sort in.
        ([0.4, 0.2, 0.2, 0.2], 0.5, [0, 1, 2, 3]),
        ([0.2, 0.2, 0.4, 0.2], 0.3, [2]),
        ([0.25, 0.25, 0.25, 0.25], 0.01, [0, 1, 2, 3]),
    ],
)
def test_nucleus_keeps_the_smallest_set_reaching_p(probs, top_p, kept):
    logits = jnp.log(jnp.asarray([probs], jnp.float32))
    out = np.asarray(nucleus(logits, top_p))[0]
    assert sorted(np.flatnonzero(np.isfinite(out))) == kept
    np.testing.assert_array_equal(out[kept], np.asarray(logits)[0, kept])  # not rescaled
    expected = nucleus_reference(np.asarray(probs, np.float64), top_p)
    assert sorted(np.flatnonzero(expected)) == kept


LOGITS = np.array([3.0, 0.3, 3.0, 1.0, 0.0, -0.7, 0.5, 1.4])  # PAD/BOS large: must be excluded
ALLOWED = np.array([EOS, 3, 4, 5, 6, 7])


def expected_first_token(temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """float64 distribution of the first sampled token over ALLOWED: PAD/BOS removed,
    temperature, then top-k, then the top-p nucleus of what is left."""
    scaled = LOGITS[ALLOWED] / temperature
    if top_k:
        scaled = np.where(scaled >= np.sort(scaled)[-top_k], scaled, -np.inf)
    probs = np.exp(scaled - scaled.max())
    return nucleus_reference(probs / probs.sum(), top_p)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, 0, 0.6), (1.0, 0, 0.9), (0.7, 0, 0.8), (1.0, 4, 0.7), (2.0, 3, 0.95)],
)
def test_frequencies_match_the_truncated_distribution(temperature, top_k, top_p):
    n = 4000
    seqs, log_probs = sample(
        constant_model(LOGITS),
        jnp.zeros((n,), jnp.int32),
        jax.random.key(7),
        batch_size=n,
        max_decode_len=2,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
    )
    first = np.asarray(seqs)[:, 0]
    expected = expected_first_token(temperature, top_k, top_p)
    assert 2 <= (expected > 0).sum() < len(ALLOWED)  # the cases do truncate, and sample
    counts = np.array([(first == t).sum() for t in ALLOWED])
    assert counts.sum() == n and not np.isin(first, [PAD, BOS]).any()
    assert (counts[expected == 0] == 0).all()  # nothing outside the nucleus, ever
    support = expected > 0
    chi2 = (((counts - n * expected) ** 2)[support] / (n * expected[support])).sum()
    # ≤ 4 degrees of freedom: P(chi2 > 30) < 1e-5 for a correct sampler (the key is fixed).
    assert chi2 < 30.0, (counts, n * expected)
    # log_probs stay the model's (T = 1, no truncation), as for top-k.
    model_logp = jax.nn.log_softmax(jnp.asarray(LOGITS))
    eos_rows = np.asarray(log_probs)[first == EOS]
    np.testing.assert_allclose(eos_rows, float(model_logp[EOS]), rtol=1e-5)


@functools.cache
def _draw(top_p: float):
    return fast_jit(
        functools.partial(
            sample, constant_model(LOGITS), batch_size=256, max_decode_len=4, top_p=top_p
        )
    )


def test_top_p_one_is_off():
    cache, key = jnp.zeros((256,), jnp.int32), jax.random.key(3)
    plain = fast_jit(
        functools.partial(sample, constant_model(LOGITS), batch_size=256, max_decode_len=4)
    )(cache, key)
    np.testing.assert_array_equal(_draw(1.0)(cache, key)[0], plain[0])


@pytest.mark.parametrize("top_p", [0.0, -0.1, 1.5])
def test_bad_top_p_is_refused(top_p):
    with pytest.raises(ValueError, match="top_p"):
        sample(
            constant_model(LOGITS),
            jnp.zeros((2,), jnp.int32),
            jax.random.key(0),
            batch_size=2,
            max_decode_len=2,
            top_p=top_p,
        )
    with pytest.raises(ConfigError, match=r"decode\.top_p"):
        DecodeConfig(top_p=top_p)


def test_top_p_reaches_the_search_from_flag_and_override(workdir, tmp_path):
    root = workdir[0]
    greedy = _translate(root, tmp_path, "greedy", "--beam", "1")
    # A nucleus this small holds the most likely token alone: sampling becomes greedy, even
    # at a temperature at which full sampling is not (tests/decode/test_translate.py).
    tiny = ["--sample", "--temperature", "5", "--seed", "3"]
    assert _translate(root, tmp_path, "flag", *tiny, "--top-p", "1e-6") == greedy
    by_config = _translate(root, tmp_path, "config", *tiny, "--config.decode.top_p=1e-6")
    assert by_config == greedy
    assert _translate(root, tmp_path, "full", *tiny) != greedy


def test_cli_names_a_bad_top_p(workdir, capsys):
    assert main(["translate", "--workdir", str(workdir[0]), "--sample", "--top-p", "1.5"]) == 2
    assert "decode.top_p" in capsys.readouterr().err


def _translate(root, tmp_path, name, *flags):
    return translate_lines(root, tmp_path, name, "--xla-opt-level", "0", *flags)
