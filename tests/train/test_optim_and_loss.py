"""The learning-rate schedule (§5.3) and the label-smoothed loss (§5.4) against formulas."""

import math

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from attnmt.common import PAD_ID
from attnmt.config.train import OptimConfig
from attnmt.errors import ConfigError
from attnmt.train.loss import loss_sums, token_losses
from attnmt.train.optim import make_optimizer, paper_schedule


@pytest.mark.parametrize("d_model, warmup", [(512, 4000), (1024, 4000), (256, 1000)])
def test_schedule_matches_the_paper_formula(d_model, warmup):
    schedule = paper_schedule(d_model, warmup)
    for step in (1, warmup // 2, warmup, 10 * warmup):
        expected = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
        # optax counts updates from 0: the paper's step s is count s - 1.
        assert float(schedule(step - 1)) == pytest.approx(expected, rel=1e-5)
    peak = d_model**-0.5 * warmup**-0.5
    assert float(schedule(warmup - 1)) == pytest.approx(peak, rel=1e-5)


def test_adam_uses_the_paper_hyperparameters():
    # One step of Adam from zero state: update = -lr * m̂ / (sqrt(v̂) + ε) = -lr * sign(g)
    # (up to ε) whatever β; the second step distinguishes β2 = 0.98 from the default 0.999.
    optimizer = make_optimizer(OptimConfig(warmup_steps=10), d_model=4)
    params = {"w": jnp.zeros(3)}
    state = optimizer.init(params)
    g1, g2 = np.array([1.0, -2.0, 0.5]), np.array([0.3, 0.1, -1.0])
    u1, state = optimizer.update({"w": jnp.asarray(g1)}, state, params)
    u2, _ = optimizer.update({"w": jnp.asarray(g2)}, state, params)
    lr = [4**-0.5 * min(s**-0.5, s * 10**-1.5) for s in (1, 2)]
    b1, b2, eps = 0.9, 0.98, 1e-9
    m, v = (1 - b1) * g1, (1 - b2) * g1**2
    np.testing.assert_allclose(
        u1["w"], -lr[0] * (m / (1 - b1)) / (np.sqrt(v / (1 - b2)) + eps), rtol=1e-5
    )
    m, v = b1 * m + (1 - b1) * g2, b2 * v + (1 - b2) * g2**2
    expected = -lr[1] * (m / (1 - b1**2)) / (np.sqrt(v / (1 - b2**2)) + eps)
    np.testing.assert_allclose(u2["w"], expected, rtol=1e-5)
    assert isinstance(optimizer, optax.GradientTransformation)


@pytest.mark.parametrize("algorithm", ["adam", "sgd"])
def test_weight_decay_is_decoupled_and_spares_biases_and_scales(algorithm):
    # Loshchilov & Hutter's AdamW: w ← w - lr·(m̂/(√v̂ + ε) + λ·w), the decay outside the
    # moments; for SGD the same reads w ← w - lr·(g + λ·w). Vectors (biases, layer-norm
    # scales) are not decayed. Reference: float64 NumPy, two updates.
    wd, b1, b2, eps = 0.3, 0.9, 0.98, 1e-9
    config = OptimConfig(warmup_steps=10, weight_decay=wd, algorithm=algorithm)
    optimizer = make_optimizer(config, d_model=4)
    rng = np.random.default_rng(0)
    params = {"kernel": rng.normal(size=(3, 2)), "bias": rng.normal(size=3)}
    grads = [{k: rng.normal(size=v.shape) for k, v in params.items()} for _ in range(2)]
    lr = [4**-0.5 * min(s**-0.5, s * 10**-1.5) for s in (1, 2)]

    jax_params = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}
    state = optimizer.init(jax_params)
    expected = {k: v.copy() for k, v in params.items()}
    moments = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in params.items()}
    for t, g in enumerate(grads, start=1):
        g32 = {k: jnp.asarray(v, jnp.float32) for k, v in g.items()}
        updates, state = optimizer.update(g32, state, jax_params)
        jax_params = optax.apply_updates(jax_params, updates)
        for name, w in expected.items():
            if algorithm == "adam":
                m, v = moments[name]
                m, v = b1 * m + (1 - b1) * g[name], b2 * v + (1 - b2) * g[name] ** 2
                moments[name] = (m, v)
                step = (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
            else:
                step = g[name]
            decay = wd * w if w.ndim >= 2 else 0.0
            expected[name] = w - lr[t - 1] * (step + decay)
    for name in params:
        # float32 arithmetic on values of order 1 over two updates
        np.testing.assert_allclose(jax_params[name], expected[name], rtol=1e-5, atol=1e-6)
    # The decay is what moved the kernel apart from plain Adam/SGD: without it the kernel
    # would differ from the reference by lr·λ·w, far beyond the tolerance.
    assert np.abs(lr[0] * wd * params["kernel"]).min() > 1e-4


def test_negative_weight_decay_is_a_config_error():
    with pytest.raises(ConfigError, match=r"optim\.weight_decay"):
        OptimConfig(weight_decay=-0.1)


def _numpy_smoothed(logits, targets, eps):
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    vocab = logits.shape[-1]
    total, count, nll_total = 0.0, 0, 0.0
    for index in np.ndindex(targets.shape):
        target = targets[index]
        if target == PAD_ID:
            continue
        q = np.full(vocab, eps / vocab)
        q[target] += 1 - eps
        total += -(q * log_probs[index]).sum()
        nll_total += -log_probs[index][target]
        count += 1
    return total, nll_total, count


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.2])
def test_label_smoothed_loss_matches_numpy(eps):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 11)) * 3
    targets = rng.integers(1, 11, size=(3, 5))
    targets[1, 3:] = PAD_ID
    targets[2, 1:] = PAD_ID
    sums = loss_sums(jnp.asarray(logits, jnp.float32), jnp.asarray(targets), eps)
    total, nll_total, count = _numpy_smoothed(logits, targets, eps)
    assert float(sums["tokens"]) == count
    assert float(sums["loss"]) == pytest.approx(total, rel=1e-5)
    assert float(sums["nll"]) == pytest.approx(nll_total, rel=1e-5)


def test_padding_contributes_nothing():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 4, 7)).astype(np.float32)
    targets = np.array([[3, 4, PAD_ID, PAD_ID], [5, PAD_ID, PAD_ID, PAD_ID]])
    sums = loss_sums(jnp.asarray(logits), jnp.asarray(targets), 0.1)
    garbage = logits.copy()
    garbage[0, 2:] = 1e3 * rng.normal(size=(2, 7))
    garbage[1, 1:] = -1e3
    other = loss_sums(jnp.asarray(garbage), jnp.asarray(targets), 0.1)
    for key in ("loss", "nll", "correct", "tokens"):
        assert float(other[key]) == pytest.approx(float(sums[key]), rel=1e-6)


def test_smoothed_loss_is_minimised_by_the_smoothed_distribution():
    vocab, eps = 6, 0.1
    q = np.full(vocab, eps / vocab)
    q[2] += 1 - eps
    best, _ = token_losses(jnp.log(jnp.asarray(q))[None, None], jnp.array([[2]]), eps)
    entropy = -(q * np.log(q)).sum()
    assert float(best[0, 0]) == pytest.approx(entropy, rel=1e-5)
    worse, _ = token_losses(
        jnp.log(jnp.asarray(np.eye(vocab)[2] * 0.99 + 0.01 / vocab))[None, None],
        jnp.array([[2]]),
        eps,
    )
    assert float(worse[0, 0]) > float(best[0, 0]) + math.ulp(1.0)


def test_cooldown_ramps_the_paper_rate_linearly_to_zero_at_num_steps():
    from attnmt.train.optim import learning_rate_schedule

    d_model, warmup, num_steps, cooldown = 64, 10, 100, 40
    config = OptimConfig(warmup_steps=warmup, learning_rate_scale=0.5, cooldown_steps=cooldown)
    schedule = learning_rate_schedule(config, d_model, num_steps)
    for step in range(1, num_steps + 1):  # the paper's step s is optax's count s - 1
        paper = 0.5 * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
        ramp = min(1.0, (num_steps - step + 1) / cooldown)
        assert float(schedule(step - 1)) == pytest.approx(paper * ramp, rel=1e-5)
    # The 60 updates before the cooldown are the paper's; the last runs at 1/40 of it.
    assert float(schedule(num_steps - 1)) == pytest.approx(
        0.5 * d_model**-0.5 * num_steps**-0.5 / cooldown, rel=1e-5
    )
    assert float(schedule(num_steps)) == 0.0


def test_cooldown_longer_than_the_run_is_a_config_error():
    from attnmt.config.experiment import Experiment
    from attnmt.errors import ConfigError

    with pytest.raises(ConfigError, match=r"optim\.cooldown_steps=50 .*train\.num_steps=20"):
        Experiment.from_mapping({"optim": {"cooldown_steps": 50}, "train": {"num_steps": 20}})
    with pytest.raises(ConfigError, match=r"optim\.cooldown_steps must be ≥ 0"):
        OptimConfig(cooldown_steps=-1)
