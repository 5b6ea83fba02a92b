"""Wiring a training run in a workdir: the one place that builds what the Trainer is given.

experiment → mesh → inputs (train/inputs.py) → program (train/program.py) → memory
pre-flight → checkpoints → state (restored, or new) → Trainer.
"""

from __future__ import annotations

import logging
import os

import jax

from attnmt.checkpoint.manager import CheckpointManager
from attnmt.config.experiment import Experiment
from attnmt.data.pipeline import BatchIterator
from attnmt.data.text_form import TextForm
from attnmt.data.tokenizer import Tokenizer
from attnmt.decode.parsing import tree_grammar
from attnmt.decode.translate import Translator
from attnmt.errors import ConfigError
from attnmt.metrics import MetricsSink
from attnmt.parallel.memory import per_device_bytes
from attnmt.parallel.mesh import make_mesh
from attnmt.storage import Path, as_path
from attnmt.train import step as steps
from attnmt.train.inputs import TrainInputs, prepare_inputs, with_recorded_data_dir
from attnmt.train.loop import Trainer, TrainResult
from attnmt.train.loss import WordClasses
from attnmt.train.preflight import memory_preflight
from attnmt.train.program import TrainProgram, build_program
from attnmt.train.stopping import BestSoFar, best_after_resume
from attnmt.train.validation import Validation

log = logging.getLogger("attnmt.train")


def build_trainer(
    experiment: Experiment, workdir: str | os.PathLike, memory_limit_bytes: int | None = None
) -> Trainer:
    """A Trainer for `experiment` in `workdir`, resumed from its newest checkpoint if any.

    `memory_limit_bytes` replaces the device's memory figure in the pre-flight check.
    """
    experiment = with_recorded_data_dir(experiment)
    workdir = as_path(workdir, "--workdir")
    mesh = make_mesh(experiment.parallel)
    inputs = prepare_inputs(experiment, workdir, mesh)
    _check_best_is_measured(experiment, inputs)
    program = build_program(experiment, mesh, _word_classes(experiment, inputs.tokenizer))
    if experiment.train.memory_preflight:
        memory_preflight(
            program, inputs.plan.micro_shapes, inputs.plan.accumulation_steps, memory_limit_bytes
        )
    # The trainer is the only writer, so it may delete saves a killed run left unfinished.
    checkpoints = CheckpointManager(
        workdir,
        keep=experiment.train.keep_checkpoints,
        clean_up_unfinished=True,
        keep_best_by=experiment.train.keep_best_by,
        keep_best=experiment.train.keep_best_checkpoints,
    )
    state = _initial_state(program, checkpoints, inputs.train_batches, workdir)
    return Trainer(
        program,
        inputs,
        state,
        checkpoints,
        MetricsSink(workdir, enabled=jax.process_index() == 0),
        _validation(program, inputs),
        _best_so_far(experiment, checkpoints, state),
    )


def _word_classes(experiment: Experiment, tokenizer: Tokenizer) -> WordClasses | None:
    """train.word_leaves_as_one_class's vocabulary classes, from the run's vocabulary as
    decoding reads it (decode/parsing.py): None when the option is off."""
    if not experiment.train.word_leaves_as_one_class:
        return None
    classes = None
    if hasattr(tokenizer, "whole_words"):  # a pair vocabulary keeps no tree tokens whole
        pieces = tokenizer.pieces(range(tokenizer.vocab_size))
        classes = WordClasses.from_vocabulary(
            tokenizer.whole_words(), pieces, experiment.model.vocab_size
        )
    if classes is None:
        raise ConfigError(
            "train.word_leaves_as_one_class needs a vocabulary that keeps the trees' brackets "
            "whole (one trained by attnmt on the treebank); this run's has none"
        )
    return classes


def _check_best_is_measured(experiment: Experiment, inputs: TrainInputs) -> None:
    """train.keep_best_by ranks an evaluation that needs data.eval_split (TrainConfig
    checked the intervals; the split is the data section's)."""
    by = experiment.train.keep_best_by
    measured = {
        "loss": inputs.evaluation is not None,
        "bleu": bool(inputs.bleu_pairs),
        "f1": bool(inputs.parse_gold),
    }
    if by and not measured[by]:
        raise ConfigError(
            f"train.keep_best_by={by!r} needs an evaluation split: set data.eval_split "
            f"(now {experiment.data.eval_split!r}) to a split with sentences"
        )


def _best_so_far(
    experiment: Experiment, checkpoints: CheckpointManager, state: steps.TrainState
) -> BestSoFar | None:
    """train.keep_best_by's best so far: a resumed run's is read from its checkpoints."""
    if not experiment.train.keep_best_by:
        return None
    best = best_after_resume(experiment.train, checkpoints.best(), int(state.step))
    if best.step is not None:
        log.info(
            "best validation %s so far: %.4f at step %d (%d evaluation(s) since)",
            best.metric,
            best.value,
            best.step,
            best.since_best,
        )
    return best


def _initial_state(
    program: TrainProgram,
    checkpoints: CheckpointManager,
    train_batches: BatchIterator,
    workdir: Path,
) -> steps.TrainState:
    latest = checkpoints.latest_step()
    if latest is not None and checkpoints.holds_params_only(latest):
        # An imported model (attnmt import): its parameters, a new optimizer, step 0 and
        # the data from the start; later checkpoints then hold the whole state.
        params = checkpoints.restore_params(latest, program.abstract_state.params)
        log.info("fine-tuning the parameters of step %d in %s", latest, workdir)
        return program.init_state().replace(params=params)
    restored = checkpoints.restore_latest(program.abstract_state)
    if restored is None:
        log.info("starting a new run in %s", workdir)
        return program.init_state()
    step, state, data_state, _ = restored
    # The position saved with the same step: the batches after it are those the
    # uninterrupted run would have drawn next.
    train_batches.set_state(data_state)
    log.info("resumed from checkpoint step %d in %s", step, workdir)
    return state


def _validation(program: TrainProgram, inputs: TrainInputs) -> Validation:
    experiment = program.experiment
    # Parameters are handed over at each BLEU pass (Validation.bleu). The train state stays
    # on the devices while it decodes, so decoding's memory budget leaves room for it.
    # A parsing run's F1 parses as `attnmt evaluate` does: only well-formed trees.
    grammar = None
    if inputs.parse_gold:
        grammar = tree_grammar(experiment, inputs.tokenizer, experiment.decode)
    translator = Translator(
        [experiment.model],
        [None],
        inputs.tokenizer,
        experiment.decode,
        grammar=grammar,
        reserved_bytes=per_device_bytes(program.abstract_state),
        text_form=TextForm.of(experiment.data),
    )
    split, shapes = inputs.evaluation if inputs.evaluation is not None else (None, [])
    return Validation(program, split, shapes, inputs.bleu_pairs, translator, inputs.parse_gold)


def train(
    experiment: Experiment, workdir: str | os.PathLike, memory_limit_bytes: int | None = None
) -> TrainResult:
    """Trains (or resumes) the experiment in `workdir`."""
    return build_trainer(experiment, workdir, memory_limit_bytes).run()
