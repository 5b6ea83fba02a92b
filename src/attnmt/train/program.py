"""The training program of an experiment on a mesh, assembled in one place.

From an Experiment and a Mesh: the model, optimizer and schedule, the abstract train state
with its shardings, a new state created straight into them, and the jitted steps (fused
train step, gradient / apply / add for accumulation, eval). The trainer, the benchmarks and
the tests take their program from here instead of wiring those parts themselves.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import Mesh

from attnmt.batch_keys import batch_keys
from attnmt.compile_options import compiler_options
from attnmt.experiment import Experiment
from attnmt.model.transformer import Transformer
from attnmt.parallel.sharding import (
    RuledJit,
    abstract_with_shardings,
    batch_shardings,
    jit_with_rules,
    replicated,
)
from attnmt.train import step as steps
from attnmt.train.optim import make_optimizer, paper_schedule

Batch = dict[str, Any]


def example_batch(rows: int = 1, length: int = 8) -> Batch:
    """A batch of zeros: parameter and optimizer-state shapes do not depend on its size."""
    tokens = np.zeros((rows, length), np.int32)
    return {"src_tokens": tokens, "tgt_tokens": tokens}


@dataclasses.dataclass(frozen=True)
class TrainProgram:
    """Everything a training loop runs, for one experiment on one mesh."""

    experiment: Experiment
    mesh: Mesh
    model: Transformer
    optimizer: optax.GradientTransformation
    learning_rate: optax.Schedule
    abstract_state: steps.TrainState  # ShapeDtypeStructs carrying their shardings
    train_step: RuledJit  # (state, batch) -> (state, metrics); donates the state
    grad_step: RuledJit  # (params, batch, rng) -> (gradient sums, loss sums)
    apply_step: RuledJit  # (state, gradient sums, loss sums) -> (state, metrics)
    add: Any  # (a, b) -> a + b over trees: sums micro-batches
    eval_step: RuledJit  # (params, batch) -> loss sums

    @property
    def state_shardings(self) -> Any:
        return jax.tree_util.tree_map(lambda x: x.sharding, self.abstract_state)

    def init_state(self) -> steps.TrainState:
        """A new state from `train.seed`, created in its shardings (nothing on one device
        first); its values do not depend on the mesh."""
        create = functools.partial(steps.create_train_state, self.model, self.optimizer)
        init = jax.jit(create, out_shardings=self.state_shardings, compiler_options=self._options())
        return init(jax.random.PRNGKey(self.experiment.train.seed), example_batch())

    def _options(self) -> dict[str, Any]:
        return compiler_options(self.experiment.train.xla_backend_optimization_level)


def abstract_state(experiment: Experiment, mesh: Mesh) -> steps.TrainState:
    """Shapes, dtypes and shardings of the experiment's train state on `mesh`, computed
    without allocating it (Orbax restores into these; a new state is created in them)."""
    model = Transformer(experiment.model)
    optimizer = make_optimizer(experiment.optim, experiment.model.d_model)
    return _abstract(model, optimizer, experiment.train.seed, mesh)


def _abstract(
    model: Transformer, optimizer: optax.GradientTransformation, seed: int, mesh: Mesh
) -> steps.TrainState:
    create = functools.partial(steps.create_train_state, model, optimizer, unbox=False)
    rng = jax.random.PRNGKey(seed)
    return abstract_with_shardings(jax.eval_shape(create, rng, example_batch()), mesh)


def build_program(experiment: Experiment, mesh: Mesh) -> TrainProgram:
    """The experiment's training program on `mesh`: steps jitted with explicit shardings
    (the state's from the logical rules, batches split over data × fsdp, metrics
    replicated), so a parallelism change is a mesh change."""
    model = Transformer(experiment.model)
    optimizer = make_optimizer(experiment.optim, experiment.model.d_model)
    optim = experiment.optim
    learning_rate = paper_schedule(
        experiment.model.d_model, optim.warmup_steps, optim.learning_rate_scale
    )
    train = experiment.train
    smoothing, rng_impl = train.label_smoothing, train.dropout_rng
    options = compiler_options(train.xla_backend_optimization_level)
    abstract = _abstract(model, optimizer, train.seed, mesh)
    state_sh = jax.tree_util.tree_map(lambda x: x.sharding, abstract)
    batch_sh = batch_shardings(mesh, batch_keys(experiment.data.packed))
    params_sh, scalar = state_sh.params, replicated(mesh)
    ruled = functools.partial(jit_with_rules, mesh=mesh, compiler_options=options)

    train_step = ruled(
        functools.partial(
            steps.train_step, model, optimizer, learning_rate, smoothing, rng_impl=rng_impl
        ),
        in_shardings=(state_sh, batch_sh),
        out_shardings=(state_sh, scalar),
        donate_argnums=(0,),
    )
    grad_step = ruled(
        functools.partial(
            steps.compute_gradients, model, label_smoothing=smoothing, rng_impl=rng_impl
        ),
        in_shardings=(params_sh, batch_sh, scalar),
        out_shardings=(params_sh, scalar),
    )
    apply_step = ruled(
        functools.partial(steps.apply_gradients, optimizer, learning_rate_fn=learning_rate),
        in_shardings=(state_sh, params_sh, scalar),
        out_shardings=(state_sh, scalar),
        donate_argnums=(0,),
    )
    add = jax.jit(
        lambda a, b: jax.tree_util.tree_map(lambda x, y: x + y, a, b), compiler_options=options
    )
    eval_step = ruled(
        functools.partial(steps.eval_step, model, smoothing),
        in_shardings=(params_sh, batch_sh),
        out_shardings=scalar,
    )
    return TrainProgram(
        experiment,
        mesh,
        model,
        optimizer,
        learning_rate,
        abstract,
        train_step,
        grad_step,
        apply_step,
        add,
        eval_step,
    )
