"""Parameter counts equal the closed-form count of the architecture (§3, Table 3)."""

import dataclasses

import pytest

from attnmt.config import load_experiment
from attnmt.config.variants import TABLE3
from attnmt.model.param_count import count_parameters
from tests.helpers import CONFIGS


def closed_form(
    d,
    d_ff,
    h,
    d_k,
    d_v,
    n,
    vocab,
    learned_positions=0,
    pre_norm=False,
    gated=False,
    scale=False,
    qk_norm=False,
):
    attention = d * h * d_k * 2 + d * h * d_v + h * d_v * d  # W^Q, W^K, W^V, W^O (no biases)
    attention += 1 if qk_norm else 0  # QKNorm's one gain per attention layer (model.qk_norm)
    ffn = d * d_ff + d_ff + d_ff * d + d  # W1, b1, W2, b2
    ffn += (d * d_ff + d_ff) if gated else 0  # the gate's V and c (model.gated_ffn)
    norm = 1 if scale else 2 * d  # ScaleNorm's one gain (model.norm_type), or gain and bias
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    embedding = vocab * d  # shared by both stacks and the pre-softmax projection
    positions = 2 * learned_positions * d  # one learned table per stack (row E)
    final_norms = 2 * norm if pre_norm else 0  # pre-norm closes each stack with a LayerNorm
    return embedding + n * (encoder_layer + decoder_layer) + positions + final_norms


@pytest.mark.parametrize("variant", ["base", "big", *TABLE3])
def test_count_matches_formula(variant):
    model = load_experiment(str(CONFIGS / f"wmt14_ende.py:variant={variant}")).model
    learned = model.max_length if model.positional == "learned" else 0
    expected = closed_form(
        model.d_model,
        model.d_ff,
        model.num_heads,
        model.d_k,
        model.d_v,
        model.num_layers,
        model.vocab_size,
        learned,
    )
    assert count_parameters(model)["total"] == expected


def test_base_model_is_the_papers_size():
    total = count_parameters(load_experiment(str(CONFIGS / "wmt14_ende.py")).model)["total"]
    # 37k shared vocabulary: 18.9M embedding + 44.1M in the stacks.
    assert total == closed_form(512, 2048, 8, 64, 64, 6, 37_000) == 63_045_632


@pytest.mark.parametrize("pair", ["en-de", "en-fr"])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("norm_type", ["layer", "scale"])
def test_multi30k_recipe_count_matches_formula(pair, gated, norm_type):
    recipe = load_experiment(str(CONFIGS / f"multi30k.py:pair={pair}")).model
    m = dataclasses.replace(recipe, gated_ffn=gated, norm_type=norm_type)
    expected = closed_form(
        m.d_model,
        m.d_ff,
        m.num_heads,
        m.d_k,
        m.d_v,
        m.num_layers,
        m.vocab_size,
        pre_norm=m.norm_position == "pre",
        gated=m.gated_ffn,
        scale=m.norm_type == "scale",
        qk_norm=m.qk_norm,
    )
    assert count_parameters(m)["total"] == expected
