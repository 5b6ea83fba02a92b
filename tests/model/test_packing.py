"""A packed row computes each of its examples exactly as a row of its own would: the
same logits, the same summed loss and the same gradients, up to float32 summation order
(the bounds of tests/equivalence.py)."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.common import BOS_ID, EOS_ID, packing_arguments
from attnmt.data.packing import pack_examples
from attnmt.data.pipeline import TokenizedCorpus
from attnmt.model.transformer import Transformer, shift_right
from attnmt.train.loss import loss_sums
from tests.equivalence import LOSS_RTOL, UPDATE_RTOL
from tests.helpers import tiny_model

CONFIG = tiny_model(d_v=6, max_length=64)  # tests/model/test_transformer.py's (dropout off)
ROW_LENGTH = 16


def _corpus(count: int, seed: int) -> TokenizedCorpus:
    rng = np.random.default_rng(seed)
    sides = []
    for _ in range(2):
        lengths = rng.integers(2, 8, size=count)
        rows = [np.r_[rng.integers(4, 24, size=n - 1), EOS_ID] for n in lengths]
        sides += [np.concatenate(rows), np.r_[0, np.cumsum(lengths)]]
    return TokenizedCorpus(*sides)


@pytest.fixture(
    scope="module",
    params=[
        (CONFIG, ROW_LENGTH),
        (dataclasses.replace(CONFIG, norm_position="pre", positional="learned"), ROW_LENGTH),
        (CONFIG, 10),  # source rows shorter than the target's (data.pack_source_length)
    ],
    ids=["post-norm-sinusoids", "pre-norm-learned-positions", "source-rows-of-10"],
)
def setup(request):
    config, source_length = request.param
    corpus = _corpus(12, seed=0)
    order = np.arange(len(corpus))
    lengths = corpus.src_lengths, corpus.tgt_lengths
    (packed_plan,) = pack_examples(*lengths, order, 6, ROW_LENGTH, source_length)
    packed = corpus.gather_packed(packed_plan, 0, 6, ROW_LENGTH, source_length)
    assert packed["src_tokens"].shape == (6, source_length)
    assert packed["src_segments"].max() >= 2, "some row must hold several examples"
    src, tgt = corpus.gather(np.arange(len(corpus)), 8)
    model = Transformer(config)
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(1), src, tgt)["params"])
    return model, params, packed, packed_plan, {"src_tokens": src, "tgt_tokens": tgt}


def _logits(model, params, batch):
    return np.asarray(
        model.apply(
            {"params": params},
            batch["src_tokens"],
            batch["tgt_tokens"],
            **packing_arguments(batch),
        ),
        np.float64,
    )


def test_each_packed_example_gets_the_logits_of_its_own_row(setup) -> None:
    model, params, packed, plan, rows = setup
    packed_logits = _logits(model, params, packed)
    own_logits = _logits(model, params, rows)
    for example in range(len(plan.example_ids)):
        row = plan.rows[example]
        # Segment k of a row is the k-th example placed in it.
        segment = int(np.sum(plan.rows[: example + 1] == row))
        columns = np.flatnonzero(packed["tgt_segments"][row] == segment)
        ex = plan.example_ids[example]
        want = own_logits[ex, : len(columns)]
        got = packed_logits[row, columns]
        # Dot products over ≤ 32 terms through two layers, summed in another order: a
        # relative error of a few 2^-24 per step; 2^-12 of the norm bounds it (equivalence.py).
        assert np.linalg.norm(got - want) <= UPDATE_RTOL / 4 * np.linalg.norm(want)


def test_the_packed_batch_has_the_summed_loss_and_gradients_of_its_rows(setup) -> None:
    model, params, packed, _, rows = setup

    def loss(p, batch):
        logits = model.apply(
            {"params": p}, batch["src_tokens"], batch["tgt_tokens"], **packing_arguments(batch)
        )
        return loss_sums(logits, batch["tgt_tokens"], 0.1)["loss"]

    loss_packed, grads_packed = jax.value_and_grad(loss)(params, packed)
    loss_rows, grads_rows = jax.value_and_grad(loss)(params, rows)
    assert float(loss_packed) == pytest.approx(float(loss_rows), rel=LOSS_RTOL)
    leaves = jax.tree_util.tree_leaves
    pairs = zip(leaves(grads_packed), leaves(grads_rows), strict=True)
    for got, want in pairs:
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        assert np.linalg.norm(want) > 0
        assert np.linalg.norm(got - want) <= UPDATE_RTOL / 2 * np.linalg.norm(want)


def test_a_wrong_segment_id_changes_the_logits(setup) -> None:
    """The comparison above can fail: merging two examples' segments lets them see each
    other, and their logits move far beyond the tolerance."""
    model, params, packed, _, _ = setup
    row = int(np.argmax(packed["src_segments"].max(axis=1)))
    merged = dict(packed)
    for side in ("src", "tgt"):
        segments = packed[f"{side}_segments"].copy()
        segments[row][segments[row] == 2] = 1
        merged[f"{side}_segments"] = segments
    base, changed = _logits(model, params, packed)[row], _logits(model, params, merged)[row]
    assert np.linalg.norm(changed - base) > 1e-3 * np.linalg.norm(base)


def test_each_packed_example_starts_its_decoder_input_with_bos() -> None:
    tgt = jnp.asarray([[5, 6, EOS_ID, 7, EOS_ID, 0]], jnp.int32)
    positions = jnp.asarray([[0, 1, 2, 0, 1, 0]], jnp.int32)
    shifted = np.asarray(shift_right(tgt, tgt_positions=positions))[0]
    assert list(shifted[:5]) == [BOS_ID, 5, 6, BOS_ID, 7]
    assert list(np.asarray(shift_right(tgt))[0]) == [BOS_ID, 5, 6, EOS_ID, 7, EOS_ID]
