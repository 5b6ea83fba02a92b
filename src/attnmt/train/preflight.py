"""Memory pre-flight: refuse a batch/model that cannot fit on the device before training.

XLA's compiled memory analysis gives the bytes one train step needs (its arguments, outputs
and temporaries); the compile is the one training would do anyway, and JAX caches it, so
the check costs little more than the first step. The estimate is compared with what the
device offers: `bytes_limit` on GPU/TPU, and on CPU the smaller of physical memory and the
cgroup limit (all CPU devices share the host's memory).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax
import jax.numpy as jnp

from attnmt.common import TOKEN_KEYS, batch_keys
from attnmt.config.experiment import Experiment
from attnmt.errors import ConfigError
from attnmt.parallel.memory import (
    NoMemoryAnalysisError,
    compiled_peak_bytes,
    compiled_stats,
    device_memory_limit,
    format_bytes,
    shared_limit,
    tree_bytes,
)
from attnmt.parallel.sharding import RuledJit
from attnmt.train.program import TrainProgram

log = logging.getLogger("attnmt.train")


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Peak bytes per device of one optimizer update on the batch shape `shape`."""

    shape: tuple[int, int]  # (sentences, tokens) of the micro-batch analysed
    state_bytes: int  # parameters, optimizer moments, step, RNG
    total_bytes: int  # everything live at the step's peak, the state included

    @property
    def other_bytes(self) -> int:
        """Activations, gradients and temporaries: what scales with the batch."""
        return max(self.total_bytes - self.state_bytes, 0)


def estimate_train_memory(
    train_step: RuledJit,
    grad_step: RuledJit,
    abstract_state: Any,
    shape: tuple[int, int],
    grad_accum_steps: int,
    keys: tuple[str, ...] = TOKEN_KEYS,
    source_length: int = 0,
) -> MemoryEstimate:
    """Compiles the step training will run on `shape` (RuledJits, abstract inputs); the
    steps keep that executable, so training does not compile it again.

    Without accumulation that is `train_step(state, batch)`, state donated. With it, the
    micro-batch `grad_step(params, batch, rng, step)` runs while the state and the running
    gradient sums (one more copy of the parameters) are held. The source arrays are
    `source_length` tokens wide (0: as the target's, `shape`'s length).
    """
    source_shape = (shape[0], source_length or shape[1])
    batch = {
        name: jax.ShapeDtypeStruct(source_shape if name.startswith("src_") else shape, jnp.int32)
        for name in keys
    }
    state_bytes = tree_bytes(abstract_state)
    if grad_accum_steps == 1:
        total = compiled_peak_bytes(train_step.compile(abstract_state, batch))
    else:
        stats = compiled_stats(
            grad_step.compile(
                abstract_state.params, batch, abstract_state.dropout_rng, abstract_state.step
            )
        )
        total = (
            state_bytes
            + tree_bytes(abstract_state.params)
            + stats.output_size_in_bytes
            + stats.temp_size_in_bytes
        )
    return MemoryEstimate(shape=shape, state_bytes=state_bytes, total_bytes=int(total))


def _remedies(experiment: Experiment, fitting_tokens: int | None) -> str:
    model, data, train = experiment.model, experiment.data, experiment.train
    hint = f"; about {fitting_tokens} may fit" if fitting_tokens else ""
    return (
        f"Lower data.tokens_per_batch (now {data.tokens_per_batch}{hint}), or keep it and set "
        f"train.max_tokens_per_device (now {train.max_tokens_per_device}; the update then "
        "accumulates micro-batches of at most that many tokens per device), or raise "
        f"train.grad_accum_steps (now {train.grad_accum_steps}; each micro-batch then holds "
        "tokens_per_batch / grad_accum_steps tokens), or shrink the model "
        f"(model.d_model={model.d_model}, model.d_ff={model.d_ff}, "
        f"{model.depth_settings()}, model.vocab_size={model.vocab_size}). "
        "train.memory_preflight=false skips this check"
    )


def check_fits(
    experiment: Experiment, estimate: MemoryEstimate, limit_bytes: int, where: str
) -> None:
    """Raises ConfigError naming the keys to change when `estimate` exceeds the limit."""
    if estimate.total_bytes <= limit_bytes:
        return
    need = (
        f"memory pre-flight: one training step on the longest bucket ({estimate.shape[0]} "
        f"sentences × {estimate.shape[1]} tokens) needs about "
        f"{format_bytes(estimate.total_bytes)} per device (train state "
        f"{format_bytes(estimate.state_bytes)}, activations, gradients and temporaries "
        f"{format_bytes(estimate.other_bytes)}) but {where} offers {format_bytes(limit_bytes)}"
    )
    if estimate.state_bytes >= limit_bytes:
        model = experiment.model
        raise ConfigError(
            f"{need}. The parameters and Adam moments alone do not fit: shrink the model "
            f"(model.d_model={model.d_model}, model.d_ff={model.d_ff}, "
            f"{model.depth_settings()}, model.vocab_size={model.vocab_size})"
        )
    # Activations grow about linearly with the tokens of a micro-batch.
    room = (limit_bytes - estimate.state_bytes) / max(estimate.other_bytes, 1)
    fitting = int(experiment.data.tokens_per_batch * room * 0.9)
    raise ConfigError(f"{need}. {_remedies(experiment, fitting)}")


def memory_preflight(
    program: TrainProgram,
    shapes: list[tuple[int, int]],
    accumulation_steps: int,
    limit_bytes: int | None = None,
) -> MemoryEstimate | None:
    """Estimates the step training will run (the fused step, or the micro-batch gradient
    step when the batch plan accumulates) on the longest bucket; refuses it if it cannot fit.

    `limit_bytes` overrides the device's figure (tests, or a share of a shared device).
    Returns the estimate, or None when the backend cannot analyse memory.
    """
    experiment = program.experiment
    # Every bucket holds about the same tokens; attention's length² makes the longest the
    # largest.
    shape = max(shapes, key=lambda s: (s[1], s[0] * s[1]))
    where = "the given limit"
    if limit_bytes is None:
        devices = list(program.mesh.devices.flat)
        limit_bytes, where = shared_limit(*device_memory_limit(devices[0]), devices)
    try:
        estimate = estimate_train_memory(
            program.train_step,
            program.grad_step,
            program.abstract_state,
            shape,
            accumulation_steps,
            batch_keys(experiment.data.packed),
            experiment.data.pack_source_length,
        )
    except NoMemoryAnalysisError as error:
        log.info("memory pre-flight skipped: %s", error)
        return None
    except jax.errors.JaxRuntimeError as error:
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        # Some compilers (TPU) refuse at compile time a program that cannot fit.
        first_line = str(error).strip().split("\n", 1)[0]
        raise ConfigError(
            f"memory pre-flight: one training step on the longest bucket ({shape[0]} "
            f"sentences × {shape[1]} tokens) does not fit on the device ({first_line}). "
            f"{_remedies(experiment, None)}"
        ) from None
    if limit_bytes is None:
        log.info(
            "memory pre-flight: the train step needs about %s per device; %s reports no "
            "limit, so it is not checked",
            format_bytes(estimate.total_bytes),
            where,
        )
        return estimate
    check_fits(experiment, estimate, limit_bytes, where)
    log.info(
        "memory pre-flight: the train step on %d × %d tokens needs about %s of %s (%s)",
        *shape,
        format_bytes(estimate.total_bytes),
        format_bytes(limit_bytes),
        where,
    )
    return estimate
