"""Nucleus (top-p) sampling: the kept set against a float64 reference (ties included),
empirical frequencies against the truncated distribution, and the setting (and epsilon
sampling's, tests/decode/test_epsilon.py) reaching the command line and the translator."""

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
from tests.decode.search_reference import (
    SAMPLER_LOGITS,
    check_sampler_frequencies,
    constant_model,
    fast_jit,
    nucleus_reference,
    tempered_first_token,
)
from tests.helpers import translate_lines


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


LOGITS = SAMPLER_LOGITS


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, 0, 0.6), (1.0, 0, 0.9), (0.7, 0, 0.8), (1.0, 4, 0.7), (2.0, 3, 0.95)],
)
def test_frequencies_match_the_truncated_distribution(temperature, top_k, top_p):
    expected = nucleus_reference(tempered_first_token(temperature, top_k), top_p)
    check_sampler_frequencies(7, expected, temperature=temperature, top_k=top_k, top_p=top_p)


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


@pytest.mark.parametrize(
    ("name", "value"),
    [("top_p", 0.0), ("top_p", -0.1), ("top_p", 1.5), ("epsilon", -0.1), ("epsilon", 1.0)],
)
def test_bad_truncation_is_refused(name, value):
    with pytest.raises(ValueError, match=name):
        sample(
            constant_model(LOGITS),
            jnp.zeros((2,), jnp.int32),
            jax.random.key(0),
            batch_size=2,
            max_decode_len=2,
            **{name: value},
        )
    with pytest.raises(ConfigError, match=rf"decode\.{name}"):
        DecodeConfig(**{name: value})


# Each truncated to the most likely token alone at temperature 5, where full sampling is
# not greedy on this model (tests/decode/test_translate.py): a nucleus of mass 1e-6, and
# epsilon 0.99, a probability no token reaches at that temperature.
TO_ONE_TOKEN = [("top_p", "--top-p", "1e-6"), ("epsilon", "--epsilon", "0.99")]


@pytest.mark.parametrize(("name", "flag", "value"), TO_ONE_TOKEN)
def test_truncation_reaches_the_search_from_flag_and_override(workdir, tmp_path, name, flag, value):
    root = workdir[0]
    greedy = _translate(root, tmp_path, "greedy", "--beam", "1")
    hot = ["--sample", "--temperature", "5", "--seed", "3"]
    assert _translate(root, tmp_path, "flag", *hot, flag, value) == greedy
    by_config = _translate(root, tmp_path, "config", *hot, f"--config.decode.{name}={value}")
    assert by_config == greedy
    assert _translate(root, tmp_path, "full", *hot) != greedy


@pytest.mark.parametrize(("name", "flag"), [("top_p", "--top-p"), ("epsilon", "--epsilon")])
def test_cli_names_a_bad_truncation(workdir, capsys, name, flag):
    assert main(["translate", "--workdir", str(workdir[0]), "--sample", flag, "1.5"]) == 2
    assert f"decode.{name}" in capsys.readouterr().err


def _translate(root, tmp_path, name, *flags):
    return translate_lines(root, tmp_path, name, "--xla-opt-level", "0", *flags)
