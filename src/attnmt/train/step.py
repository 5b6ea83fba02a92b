"""Pure train and eval steps. No I/O here: the loop (train/loop.py) owns that."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from attnmt.common import packing_arguments
from attnmt.model.transformer import Transformer
from attnmt.train.loss import WordClasses, loss_sums

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]
RngImpl = Literal["threefry", "rbg"]


@flax.struct.dataclass
class TrainState:
    """Everything that changes during training; saved whole in every checkpoint."""

    step: jax.Array  # optimizer updates applied so far
    params: Any
    opt_state: Any
    dropout_rng: jax.Array  # base key; step t uses fold_in(dropout_rng, t)
    skipped_steps: jax.Array  # consecutive updates skipped for non-finite values


@dataclasses.dataclass(frozen=True)
class DropoutPhases:
    """The model as training runs it under train.early_dropout_*: `early` (the same
    parameters, another dropout rate) for the updates before `early_steps`, then `model`."""

    model: Transformer
    early: Transformer
    early_steps: int


TrainedModel = Transformer | DropoutPhases


def create_train_state(
    model: Transformer,
    optimizer: optax.GradientTransformation,
    rng: jax.Array,
    example: Batch,
    unbox: bool = True,
) -> TrainState:
    """Initialises parameters (float32) and optimizer state from an example batch's shapes.

    With `unbox=False` parameters and optimizer moments keep their logical-axis boxes, so
    `parallel.sharding` can derive every array's sharding before anything is allocated.
    """
    init_rng, dropout_rng = jax.random.split(rng)
    variables = model.init(init_rng, example["src_tokens"], example["tgt_tokens"])
    params = nn.meta.unbox(variables["params"]) if unbox else variables["params"]
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        dropout_rng=dropout_rng,
        skipped_steps=jnp.zeros((), jnp.int32),
    )


def dropout_key(rng: jax.Array, impl: RngImpl) -> jax.Array:
    """The key dropout draws from: `rng` itself, or an "rbg" key seeded from it.

    "rbg" makes dropout masks with XLA's RngBitGenerator instead of threefry hashing: far
    fewer instructions per random bit on CPU and GPU. Its bits are a pure function of the
    key (resume stays bit-exact) but, unlike threefry, may change with the mesh.
    """
    if impl == "threefry":
        return rng
    data = jax.random.key_data(rng) if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) else rng
    data = data.astype(jnp.uint32)
    seed = jnp.concatenate([data, data ^ jnp.uint32(0x9E3779B9)])  # rbg keys hold 4 words
    return jax.random.wrap_key_data(seed, impl="rbg")


def compute_gradients(
    model: TrainedModel,
    params: Any,
    batch: Batch,
    rng: jax.Array,
    label_smoothing: float,
    rng_impl: RngImpl = "threefry",
    word_classes: WordClasses | None = None,
    step: jax.Array | int = 0,
) -> tuple[Any, Metrics]:
    """Gradients of the loss SUMMED over the batch's real target tokens, plus the sums.

    Summing (not averaging) lets micro-batches of different sizes be accumulated exactly;
    `apply_gradients` divides by the total token count (§5.4 per-token normalisation).
    `word_classes`: the loss over copied words as one class (train/loss.py). `step`: the
    update's number, which picks a DropoutPhases' model.
    """
    rng = dropout_key(rng, rng_impl)

    def logits_of(module: Transformer) -> Any:
        def apply(p: Any) -> jax.Array:
            return module.apply(
                {"params": p},
                batch["src_tokens"],
                batch["tgt_tokens"],
                train=True,
                rngs={"dropout": rng},
                **packing_arguments(batch),
            )

        return apply

    def summed_loss(p: Any) -> tuple[jax.Array, Metrics]:
        if isinstance(model, DropoutPhases):
            # One compiled update holding both; only the branch taken runs.
            early = jnp.asarray(step) < model.early_steps
            logits = jax.lax.cond(early, logits_of(model.early), logits_of(model.model), p)
        else:
            logits = logits_of(model)(p)
        sums = loss_sums(logits, batch["tgt_tokens"], label_smoothing, word_classes)
        return sums["loss"], sums

    grads, sums = jax.grad(summed_loss, has_aux=True)(params)
    return grads, sums


def apply_gradients(
    optimizer: optax.GradientTransformation,
    state: TrainState,
    grad_sums: Any,
    sums: Metrics,
    learning_rate_fn: optax.Schedule,
) -> tuple[TrainState, Metrics]:
    """One optimizer update from accumulated gradient sums; skips it if anything is non-finite."""
    tokens = jnp.maximum(sums["tokens"], 1.0)
    grads = jax.tree_util.tree_map(lambda g: g / tokens, grad_sums)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(grad_norm) & jnp.isfinite(sums["loss"])
    updates, new_opt_state = optimizer.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)

    def keep_if_finite(new: Any, old: Any) -> Any:
        return jax.tree_util.tree_map(lambda n, o: jnp.where(finite, n, o), new, old)

    new_state = state.replace(
        step=state.step + finite.astype(jnp.int32),
        params=keep_if_finite(new_params, state.params),
        opt_state=keep_if_finite(new_opt_state, state.opt_state),
        skipped_steps=jnp.where(finite, 0, state.skipped_steps + 1),
    )
    metrics = summarize(sums)
    metrics.update(
        learning_rate=learning_rate_fn(state.step),
        grad_norm=grad_norm,
        skipped=(~finite).astype(jnp.int32),
    )
    return new_state, metrics


def summarize(sums: Metrics) -> Metrics:
    """Per-token loss, nll, perplexity and accuracy from summed counts."""
    tokens = jnp.maximum(sums["tokens"], 1.0)
    nll = sums["nll"] / tokens
    return {
        "loss": sums["loss"] / tokens,
        "nll": nll,
        "perplexity": jnp.exp(nll),
        "accuracy": sums["correct"] / tokens,
        "tokens": sums["tokens"],
    }


def train_step(
    model: TrainedModel,
    optimizer: optax.GradientTransformation,
    learning_rate_fn: optax.Schedule,
    label_smoothing: float,
    state: TrainState,
    batch: Batch,
    rng_impl: RngImpl = "threefry",
    word_classes: WordClasses | None = None,
) -> tuple[TrainState, Metrics]:
    """One update from one batch (no accumulation): gradients and update fused in one jit."""
    rng = jax.random.fold_in(state.dropout_rng, state.step)
    grads, sums = compute_gradients(
        model, state.params, batch, rng, label_smoothing, rng_impl, word_classes, state.step
    )
    return apply_gradients(optimizer, state, grads, sums, learning_rate_fn)


def eval_step(
    model: Transformer,
    label_smoothing: float,
    params: Any,
    batch: Batch,
    word_classes: WordClasses | None = None,
) -> Metrics:
    """Summed loss statistics of one batch without dropout; sum over batches, then summarize.
    With `word_classes`, training's loss over copied words as one class, so the validation
    nll measures what a copying tree grammar's decoding scores."""
    logits = model.apply(
        {"params": params}, batch["src_tokens"], batch["tgt_tokens"], **packing_arguments(batch)
    )
    return loss_sums(logits, batch["tgt_tokens"], label_smoothing, word_classes)
