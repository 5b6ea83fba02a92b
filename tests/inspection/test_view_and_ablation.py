"""The attention view is what the model computes, its statistics follow their formulas,
and head ablation removes exactly one head (what ablate_heads makes of that, and the command:
test_ablation.py)."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import pytest

from attnmt.common import BOS_ID, EOS_ID
from attnmt.inspection.ablation import without_head
from attnmt.inspection.stats import head_statistics, head_values
from attnmt.inspection.view import AttentionView, view_from_ids
from attnmt.model.transformer import Transformer
from tests.helpers import tiny_model
from tests.model import reference

CONFIG = tiny_model()
SRC = [5, 6, 7, 8, 9, EOS_ID]
TGT = [10, 11, 12, EOS_ID]


@pytest.fixture(scope="module")
def params():
    tokens = np.ones((1, 6), np.int32)
    # Jitted at XLA level 0: one short compile instead of one per operation (15 s → 4 s).
    init = jax.jit(Transformer(CONFIG).init, compiler_options={"xla_backend_optimization_level": 0})
    variables = init(jax.random.PRNGKey(1), tokens, tokens)
    return nn.meta.unbox(variables["params"])


@pytest.fixture(scope="module")
def view(params) -> AttentionView:
    pieces = [f"s{i}" for i in SRC], [f"t{i}" for i in TGT]
    return view_from_ids(CONFIG, params, SRC, TGT, *pieces)


def test_every_map_is_a_distribution_and_decoder_rows_see_no_future(view):
    assert set(view.weights) == {"encoder", "decoder", "cross"}
    assert view.weights["encoder"].shape == (2, 2, 6, 6)
    assert view.weights["decoder"].shape == (2, 2, 4, 4)
    assert view.weights["cross"].shape == (2, 2, 4, 6)
    for weights in view.weights.values():
        np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
        assert (weights >= 0).all()
    future = np.triu(np.ones((4, 4), bool), k=1)
    assert (view.weights["decoder"][..., future] < 1e-6).all()
    assert view.queries("cross") == ["t10", "t11", "t12", f"t{EOS_ID}"]
    assert view.keys("decoder") == ["<s>", "t10", "t11", "t12"]
    assert view.keys("cross") == view.source


def _first_layer_weights(params, tokens, layer_params) -> np.ndarray:
    """softmax(x W_Q (x W_K)ᵀ / √d_k) of layer 0, from the paper's embedding (§3.4, §3.5)."""
    embedding = np.float64(params["embed"]["embedding"])
    x = embedding[tokens] * np.sqrt(CONFIG.d_model) + reference.sinusoids(
        len(tokens), CONFIG.d_model
    )
    wq = np.float64(layer_params["query"]["kernel"])
    wk = np.float64(layer_params["key"]["kernel"])
    heads = []
    for h in range(CONFIG.num_heads):
        logits = (x @ wq[:, h]) @ (x @ wk[:, h]).T / np.sqrt(CONFIG.d_k)
        if tokens[0] == BOS_ID:  # decoder self-attention: causal
            logits = np.where(np.tril(np.ones_like(logits, bool)), logits, -np.inf)
        heads.append(reference.softmax(logits))
    return np.stack(heads)


def test_shown_heads_equal_the_heads_recomputed_by_hand(view, params):
    encoder = _first_layer_weights(params, np.asarray(SRC), params["encoder_0"]["self_attention"])
    np.testing.assert_allclose(view.weights["encoder"][0], encoder, atol=1e-5)
    decoder_input = np.asarray([BOS_ID, *TGT[:-1]])
    decoder = _first_layer_weights(params, decoder_input, params["decoder_0"]["self_attention"])
    np.testing.assert_allclose(view.weights["decoder"][0], decoder, atol=1e-5)


def test_statistics_follow_their_formulas():
    weights = np.zeros((1, 1, 3, 3), np.float32)
    weights[0, 0] = [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]
    cross = np.full((1, 1, 3, 3), 1 / 3, np.float32)
    view = AttentionView(
        ["a", "b", "</s>"],
        ["x", "y", "</s>"],
        {"encoder": weights, "decoder": weights, "cross": cross},
    )
    values = head_values(view, "encoder", 0, 0)
    assert values["entropy"] == pytest.approx(np.log(2) / 3)
    assert values["distance"] == pytest.approx(0.5 / 3)  # only row 1 looks one step away
    assert values["previous"] == pytest.approx(0.5 / 3)
    assert values["same"] == pytest.approx(2.5 / 3)
    assert values["next"] == pytest.approx(0.0)
    assert values["special"] == pytest.approx(1 / 3)  # EOS: the last source key
    assert head_values(view, "decoder", 0, 0)["special"] == pytest.approx(1.5 / 3)  # <s>
    crossed = head_values(view, "cross", 0, 0)
    assert crossed["entropy"] == pytest.approx(np.log(3)) and np.isnan(crossed["distance"])
    rows = head_statistics([view, view])
    assert [(r.kind, r.layer, r.head) for r in rows] == [
        (k, 0, 0) for k in ("encoder", "decoder", "cross")
    ]


def test_ablating_a_head_removes_exactly_its_contribution(params):
    ablated = without_head(CONFIG, params, "encoder", 1, 0)
    module = ablated["encoder_1"]["self_attention"]
    full = params["encoder_1"]["self_attention"]
    # Only that kernel slice changed, and the caller's parameters are untouched.
    changed = [
        path
        for (path, a), (_, b) in zip(
            jax.tree_util.tree_flatten_with_path(params)[0],
            jax.tree_util.tree_flatten_with_path(ablated)[0],
            strict=True,
        )
        if not np.array_equal(a, b)
    ]
    assert len(changed) == 1 and "encoder_1" in str(changed[0]) and "out" in str(changed[0])
    assert not np.any(np.asarray(module["out"]["kernel"])[0])
    # On the device, placed as the original (a host array would make a compiled decoder
    # compile again for each ablated module).
    assert isinstance(module["out"]["kernel"], jax.Array)
    assert module["out"]["kernel"].sharding == full["out"]["kernel"].sharding
    assert np.any(np.asarray(full["out"]["kernel"])[0])
    # MultiHead(x) − MultiHead_without_0(x) = head_0(x) W^O_0, in float64.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 5, CONFIG.d_model))
    mask = np.ones((1, 1, 5, 5), bool)
    difference = reference.multi_head(x, x, full, mask) - reference.multi_head(x, x, module, mask)
    q = x @ np.float64(full["query"]["kernel"])[:, 0]
    k = x @ np.float64(full["key"]["kernel"])[:, 0]
    v = x @ np.float64(full["value"]["kernel"])[:, 0]
    head = reference.softmax(q @ k.transpose(0, 2, 1) / np.sqrt(CONFIG.d_k)) @ v
    np.testing.assert_allclose(difference, head @ np.float64(full["out"]["kernel"])[0], atol=1e-9)
    with pytest.raises(ValueError, match="outside"):
        without_head(CONFIG, params, "cross", 2, 0)


def test_scanned_parameters_give_the_same_view_and_ablation(params, view):
    import dataclasses

    from attnmt.model.layout import stack_layers

    scanned = dataclasses.replace(CONFIG, scan_layers=True)
    stacked = stack_layers(params, CONFIG)
    pieces = [f"s{i}" for i in SRC], [f"t{i}" for i in TGT]
    again = view_from_ids(scanned, stacked, SRC, TGT, *pieces)
    for kind in view.weights:
        np.testing.assert_allclose(again.weights[kind], view.weights[kind], atol=1e-6)
    ablated = without_head(scanned, stacked, "cross", 1, 1)
    expected = without_head(CONFIG, params, "cross", 1, 1)
    for a, b in zip(
        jax.tree_util.tree_leaves(ablated), jax.tree_util.tree_leaves(expected), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
