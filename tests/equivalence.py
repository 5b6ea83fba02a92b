"""Bounds for comparing two runs of the same float32 training math done in another order.

Another mesh, another process count or gradient accumulation changes the order in which
XLA sums things (all-reduces, split contractions, micro-batch sums), and which order is
fastest also depends on the CPU's vector width (AVX2 or AVX-512). So two such runs agree
to rounding, not bit for bit, and a bound must hold whatever the order.

Why these runs use `optim.algorithm="sgd"`: SGD's update −lr·g is linear in the gradient,
so a gradient error δ becomes a parameter error lr·δ. Adam's first update is
lr·g/(|g| + ε) per parameter, ≈ ±lr whatever |g| is; a gradient that is zero up to
rounding (|g| ≈ 1e-9, there are always some) can flip sign between two orders and move
its parameter by up to 2·lr, the size of a whole update. No bound below an update's own
size holds for Adam, and a bound that large cannot catch a wrong gradient.

The bound, per parameter array, on the SGD updates d = params_after − params_before over
t steps, norm-wise:

    ‖d_a − d_b‖ ≤ UPDATE_RTOL · ‖d_a‖ + 2·t·u·‖params_after‖

The second term is storage: each step rounds every parameter to float32 (half an ulp,
≤ u·|p|), in each of the two runs, so their difference can reach 2·t·u·|p| per entry with
gradients that agree exactly.

The first term is the gradients' own rounding. A float32 sum of n terms in any order is
within (n − 1)·u·Σ|terms| of the exact sum (Higham, "Accuracy and Stability of Numerical
Algorithms", §4.2), u = 2^-24; rounding errors of mixed sign grow like √n·u in practice
(§2.8), and a norm over a whole array measures that typical growth. A gradient entry here
sums n ≤ 2^9 per-token terms, each the end of dot products over ≤ 2^6 terms: √(2^15)·u ≈
2^-16.5 relative to the magnitudes summed. Per-token terms of mixed sign cancel, so the
magnitudes summed exceed the result by up to √n ≈ 2^4.5: ≈ 2^-12 per run, 2^-11 for the
difference of two, and twice that for differences compounding over a few steps: 2^-10.
Measured on an AMD EPYC (AVX2): at most 3.3e-5 ≈ 2^-15 of the update's norm.

What the bound must catch is an update that is wrong by a sizeable fraction: a missing or
doubled all-reduce (a factor of 1/shards or 2), a gradient divided by the wrong token
count, a micro-batch dropped or counted twice. Each changes the update by ≥ 1/8 of itself
here, over 100× the bound (a 1 % error in one of two micro-batches' gradients was
checked to fail).

Losses: the per-token cross-entropies are positive, so their sum in any order is within
γ_n relative (no cancellation); each term comes through log-softmax over at most 64
logits from dot products of at most 64 terms, so the loss is within (n + 2·64)·u ≤
2^10·u = 2^-14 relative of exact; two orders, twice that, and parameters that already
differ by rounding after earlier steps: LOSS_RTOL = 2^-12.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

UNIT_ROUNDOFF = 2.0**-24  # float32
UPDATE_RTOL = 2.0**-10
LOSS_RTOL = 2.0**-12


def _leaves(tree: Any) -> list[np.ndarray]:
    return [np.asarray(leaf, np.float64) for leaf in jax.tree_util.tree_leaves(tree)]


def assert_same_updates(
    initial: Any, reference: Any, other: Any, steps: int, rtol: float = UPDATE_RTOL
) -> float:
    """Both runs started from `initial` and took `steps` SGD steps; their updates agree per
    array within the bound above. Returns the largest error seen, as a fraction of the
    update's norm."""
    worst = 0.0
    leaves = zip(_leaves(initial), _leaves(reference), _leaves(other), strict=True)
    for index, (start, ref, got) in enumerate(leaves):
        update = ref - start
        scale = np.linalg.norm(update)
        assert scale > 0, f"array {index} did not move: nothing is compared"
        storage = 2 * steps * UNIT_ROUNDOFF * np.linalg.norm(ref)
        error = np.linalg.norm((got - start) - update)
        worst = max(worst, float(error / scale))
        assert error <= rtol * scale + storage, (
            f"array {index} {ref.shape}: updates differ by {error:.3g} (norm), more than "
            f"{rtol:.3g} × {scale:.3g} + {storage:.3g}"
        )
    print(f"largest update difference: {worst:.3g} of the update's norm")
    return worst


def assert_same_losses(reference: list[float], other: list[float], rtol: float = LOSS_RTOL):
    np.testing.assert_allclose(other, reference, rtol=rtol, atol=0)


def initial_params(experiment: Any) -> Any:
    """The parameters a new run of `experiment` starts from (drawn from train.seed; the
    values do not depend on the mesh, see tests/parallel/test_sharding.py)."""
    from attnmt.config.parallel import ParallelConfig
    from attnmt.parallel.mesh import make_mesh
    from attnmt.train.program import build_program

    one_device = make_mesh(ParallelConfig(data=1), jax.devices()[:1])
    return jax.device_get(build_program(experiment, one_device).init_state().params)
