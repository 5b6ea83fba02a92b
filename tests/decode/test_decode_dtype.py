"""`decode.dtype`: a float32 model decoded in bfloat16 agrees with its float32 decoding.

Stated agreement, on a tiny random model (flat distributions, the hard case for argmax):
at least 75% of 32 greedy outputs identical (measured: 31 of 32), and where the outputs
agree, |log P_bf16 − log P_f32| ≤ 4·u·|log P_f32| with u = 2⁻⁸ bfloat16's unit roundoff
(measured: ≤ 0.4%). The bound is an error model, not a proof: every token's log-probability
is a logit minus a log-sum-exp, each of about its own size, computed by a network whose every
layer output is rounded to 8 significant bits; four roundings' worth of relative error per
token, and Σ_t |log p_t| = |log P| since every log p_t ≤ 0.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from attnmt.cli.main import main
from attnmt.config.decode import DecodeConfig
from attnmt.data.tokenizer import Tokenizer
from attnmt.decode.translate import Translator, decoding_model_config, parse_hypothesis
from attnmt.errors import ConfigError
from tests.helpers import WORDS, tiny_model

U_BF16 = 2.0**-8
RNG = random.Random(1)
LINES = [" ".join(RNG.choice(WORDS) for _ in range(RNG.randint(2, 8))) for _ in range(32)]


def _scored(workdir, dtype: str, beam: int = 1):
    root, experiment, params = workdir
    decode = DecodeConfig(
        beam_size=beam,
        max_len_offset=5,
        batch_sentences=8,
        xla_backend_optimization_level=0,
        dtype=dtype,
    )
    tokenizer = Tokenizer.load(root / "vocab.model")
    translator = Translator([experiment.model], [params], tokenizer, decode, nbest=1)
    return [best[0] for best in translator.translate_nbest(LINES)]


@pytest.mark.parametrize("beam", [1, 2])
def test_bfloat16_decoding_agrees_with_float32(workdir, beam):
    assert workdir[1].model.dtype == "float32"
    full, half = _scored(workdir, "", beam), _scored(workdir, "bfloat16", beam)
    same = [a.text == b.text for a, b in zip(full, half, strict=True)]
    assert sum(same) >= 0.75 * len(LINES), sum(same)
    differences = []
    for a, b, agree in zip(full, half, same, strict=True):
        if agree:
            assert abs(b.log_prob - a.log_prob) <= 4 * U_BF16 * abs(a.log_prob), (a, b)
            differences.append(abs(b.log_prob - a.log_prob))
    # The dtype did reach the model: bfloat16 rounding moves the scores.
    assert max(differences) > 1e-4


def test_empty_dtype_is_the_models_own(workdir):
    own = _scored(workdir, "")
    assert _scored(workdir, "float32") == own


def test_decoding_model_config_replaces_only_the_dtype():
    trained = tiny_model(dtype="bfloat16")
    assert decoding_model_config(trained, DecodeConfig()) is trained
    replaced = decoding_model_config(trained, DecodeConfig(dtype="float32"))
    assert replaced.dtype == "float32"
    assert replaced == tiny_model(dtype="float32")


def test_bad_dtype_is_refused():
    with pytest.raises(ConfigError, match=r"decode\.dtype"):
        DecodeConfig(dtype="float16")


def test_cli_dtype_flag_and_override(workdir, tmp_path):
    source = tmp_path / "input.txt"
    source.write_text("\n".join(LINES[:6]) + "\n")

    def run(name, *flags):
        target = tmp_path / f"{name}.txt"
        argv = ["translate", "--workdir", str(workdir[0]), "--input", str(source)]
        assert main([*argv, "--output", str(target), "--scores", "--beam", "1", *flags]) == 0
        return [parse_hypothesis(line)[2] for line in target.read_text().splitlines()]

    full, half = run("full"), run("half", "--dtype", "bfloat16")
    assert run("override", "--config.decode.dtype=bfloat16") == half
    assert [h.log_prob for h in half] != [h.log_prob for h in full]
    pairs = [(a.log_prob, b.log_prob) for a, b in zip(full, half, strict=True) if a.text == b.text]
    assert pairs and np.allclose(*np.transpose(pairs), rtol=4 * U_BF16)
