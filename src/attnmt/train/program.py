"""The training program of an experiment on a mesh, assembled in one place.

From an Experiment and a Mesh: the model, optimizer and schedule, the abstract train state
with its shardings, a new state created straight into them, and the jitted steps (fused
train step, gradient / apply / add for accumulation, eval), and the same steps unjitted
(`TrainProgram.plain`, for the benchmarks' own ahead-of-time compiles). The trainer, the
benchmarks and the tests take their program from here instead of wiring those parts
themselves.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import numpy as np
import optax
from jax.sharding import Mesh

from attnmt.common import batch_keys
from attnmt.config.experiment import Experiment
from attnmt.config.xla import compiler_options
from attnmt.errors import ConfigError
from attnmt.model.transformer import Transformer
from attnmt.parallel.sharding import (
    RuledJit,
    abstract_with_shardings,
    batch_shardings,
    jit_with_rules,
    replicated,
)
from attnmt.train import step as steps
from attnmt.train.loss import WordClasses
from attnmt.train.optim import learning_rate_schedule, make_optimizer, optimizer_with_schedule

Batch = dict[str, Any]


def example_batch(rows: int = 1, length: int = 8) -> Batch:
    """A batch of zeros: parameter and optimizer-state shapes do not depend on its size."""
    tokens = np.zeros((rows, length), np.int32)
    return {"src_tokens": tokens, "tgt_tokens": tokens}


@dataclasses.dataclass(frozen=True)
class PlainSteps:
    """The step functions a TrainProgram jits, bound to its model, optimizer and schedule
    but not jitted: for callers that jit and compile them their own way (the benchmarks
    compile per shape ahead of time, on one device, without shardings)."""

    train_step: Any  # (state, batch) -> (state, metrics)
    grad_step: Any  # (params, batch, rng, step) -> (gradient sums, loss sums)
    apply_step: Any  # (state, gradient sums, loss sums) -> (state, metrics)
    eval_step: Any  # (params, batch) -> loss sums
    create_state: Any  # (rng, example batch) -> a new TrainState, unboxed


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
    grad_step: RuledJit  # (params, batch, rng, step) -> (gradient sums, loss sums)
    apply_step: RuledJit  # (state, gradient sums, loss sums) -> (state, metrics)
    add: Any  # (a, b) -> a + b over trees: sums micro-batches
    eval_step: RuledJit  # (params, batch) -> loss sums
    plain: PlainSteps  # the same steps unjitted

    @property
    def state_shardings(self) -> Any:
        return jax.tree_util.tree_map(lambda x: x.sharding, self.abstract_state)

    def init_state(self) -> steps.TrainState:
        """A new state from `train.seed`, created in its shardings (nothing on one device
        first); its values do not depend on the mesh."""
        init = jax.jit(
            self.plain.create_state,
            out_shardings=self.state_shardings,
            compiler_options=self._options(),
        )
        return init(jax.random.PRNGKey(self.experiment.train.seed), example_batch())

    def _options(self) -> dict[str, Any]:
        return compiler_options(self.experiment.train.xla_backend_optimization_level)


def abstract_state(experiment: Experiment, mesh: Mesh) -> steps.TrainState:
    """Shapes, dtypes and shardings of the experiment's train state on `mesh`, computed
    without allocating it (Orbax restores into these; a new state is created in them)."""
    model = Transformer(experiment.model)
    optimizer = make_optimizer(
        experiment.optim, experiment.model.d_model, experiment.train.num_steps
    )
    return _abstract(model, optimizer, experiment.train.seed, mesh)


def _abstract(
    model: Transformer, optimizer: optax.GradientTransformation, seed: int, mesh: Mesh
) -> steps.TrainState:
    create = functools.partial(steps.create_train_state, model, optimizer, unbox=False)
    rng = jax.random.PRNGKey(seed)
    return abstract_with_shardings(jax.eval_shape(create, rng, example_batch()), mesh)


def _plain_steps(
    experiment: Experiment,
    model: Transformer,
    optimizer: optax.GradientTransformation,
    learning_rate: optax.Schedule,
    word_classes: WordClasses | None = None,
) -> PlainSteps:
    """The experiment's steps bound to `model`, `optimizer` and `learning_rate`, with its
    label smoothing and dropout RNG, unjitted; `word_classes` (constants the steps capture)
    make their loss treat copied words as one class (train.word_leaves_as_one_class)."""
    smoothing, rng_impl = experiment.train.label_smoothing, experiment.train.dropout_rng
    loss = {"rng_impl": rng_impl, "word_classes": word_classes}
    trained = trained_model(experiment, model)

    def grad_step(params: Any, batch: Batch, rng: jax.Array, step: jax.Array) -> Any:
        return steps.compute_gradients(trained, params, batch, rng, smoothing, step=step, **loss)

    return PlainSteps(
        train_step=functools.partial(
            steps.train_step, trained, optimizer, learning_rate, smoothing, **loss
        ),
        grad_step=grad_step,
        apply_step=functools.partial(
            steps.apply_gradients, optimizer, learning_rate_fn=learning_rate
        ),
        eval_step=functools.partial(steps.eval_step, model, smoothing, word_classes=word_classes),
        create_state=functools.partial(steps.create_train_state, model, optimizer),
    )


def trained_model(experiment: Experiment, model: Transformer) -> steps.TrainedModel:
    """What the train steps run: `model`, or with train.early_dropout_steps the same model
    with train.early_dropout_rate for those first updates (steps.DropoutPhases)."""
    train = experiment.train
    if not train.early_dropout_steps:
        return model
    early = dataclasses.replace(experiment.model, dropout_rate=train.early_dropout_rate)
    return steps.DropoutPhases(model, Transformer(early), train.early_dropout_steps)


class _JittedSteps(NamedTuple):
    train_step: RuledJit
    grad_step: RuledJit
    apply_step: RuledJit
    add: Any
    eval_step: RuledJit


def _jit_steps(
    plain: PlainSteps, abstract: steps.TrainState, mesh: Mesh, packed: bool, options: dict[str, Any]
) -> _JittedSteps:
    """`plain` jitted with the shardings `abstract` carries for the state, batches split
    over data × fsdp and metrics replicated."""
    state_sh = jax.tree_util.tree_map(lambda x: x.sharding, abstract)
    batch_sh = batch_shardings(mesh, batch_keys(packed))
    params_sh, scalar = state_sh.params, replicated(mesh)
    ruled = functools.partial(jit_with_rules, mesh=mesh, compiler_options=options)
    return _JittedSteps(
        train_step=ruled(
            plain.train_step,
            in_shardings=(state_sh, batch_sh),
            out_shardings=(state_sh, scalar),
            donate_argnums=(0,),
        ),
        grad_step=ruled(
            plain.grad_step,
            in_shardings=(params_sh, batch_sh, scalar, scalar),
            out_shardings=(params_sh, scalar),
        ),
        apply_step=ruled(
            plain.apply_step,
            in_shardings=(state_sh, params_sh, scalar),
            out_shardings=(state_sh, scalar),
            donate_argnums=(0,),
        ),
        add=jax.jit(
            lambda a, b: jax.tree_util.tree_map(lambda x, y: x + y, a, b),
            compiler_options=options,
        ),
        eval_step=ruled(plain.eval_step, in_shardings=(params_sh, batch_sh), out_shardings=scalar),
    )


def build_program(
    experiment: Experiment, mesh: Mesh, word_classes: WordClasses | None = None
) -> TrainProgram:
    """The experiment's training program on `mesh`: steps jitted with explicit shardings
    (the state's from the logical rules, batches split over data × fsdp, metrics
    replicated), so a parallelism change is a mesh change. `word_classes`: the run's
    vocabulary classes, which train.word_leaves_as_one_class needs (and only it uses)."""
    if experiment.train.word_leaves_as_one_class and word_classes is None:
        raise ConfigError(
            "train.word_leaves_as_one_class needs the run's vocabulary classes "
            "(WordClasses, train/loss.py): build the program as the trainer does"
        )
    word_classes = word_classes if experiment.train.word_leaves_as_one_class else None
    model = Transformer(experiment.model)
    train = experiment.train
    d_model, num_steps = experiment.model.d_model, train.num_steps
    learning_rate = learning_rate_schedule(experiment.optim, d_model, num_steps)
    optimizer = optimizer_with_schedule(experiment.optim, learning_rate)
    abstract = _abstract(model, optimizer, train.seed, mesh)
    plain = _plain_steps(experiment, model, optimizer, learning_rate, word_classes)
    options = compiler_options(train.xla_backend_optimization_level)
    jitted = _jit_steps(plain, abstract, mesh, experiment.data.packed, options)
    return TrainProgram(
        experiment=experiment,
        mesh=mesh,
        model=model,
        optimizer=optimizer,
        learning_rate=learning_rate,
        abstract_state=abstract,
        plain=plain,
        **jitted._asdict(),
    )
