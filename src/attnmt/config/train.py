"""Typed configuration of training: the `optim` and `train` sections of a config file.

Plain dataclasses with no jax, so loading a run for inference can read a config without
importing the training code."""

from __future__ import annotations

import dataclasses
from typing import Literal

from attnmt.config.typed import check_types
from attnmt.config.xla import OptimizationLevel
from attnmt.errors import ConfigError

# The interval of the evaluation each train.keep_best_by value ranks.
_RANKED_EVERY = {"loss": "eval_every_steps", "bleu": "bleu_every_steps", "f1": "f1_every_steps"}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    num_steps: int = 100_000  # optimizer updates (§5.2: base 100k, big 300k)
    time_limit_minutes: float = 0.0  # stop (with a checkpoint) after this long; 0 = none
    label_smoothing: float = 0.1  # §5.4 ε_ls
    grad_accum_steps: int = 1  # at least this many micro-batches per update (row-wise split)
    # >0: split each update into more micro-batches until no device holds more padded
    # tokens per side at once (the update, and so the data order, stays the same)
    max_tokens_per_device: int = 0
    log_every_steps: int = 100
    eval_every_steps: int = 1000  # validation loss; 0 = never
    bleu_every_steps: int = 0  # beam-search BLEU on the eval split (decode.*); 0 = never
    bleu_max_sentences: int = 0  # translate only the first N eval sentences; 0 = all
    # A parsing run's counterpart (data.source="treebank"): parse the eval split's sentences
    # with decode.* and score them against its gold trees as `attnmt evaluate` does (EVALB's
    # COLLINS.prm figures, gold tags), every this many updates; 0 = never
    f1_every_steps: int = 0
    f1_max_sentences: int = 0  # parse only the first N eval trees; 0 = all
    checkpoint_every_steps: int = 0  # 0 = only by time
    checkpoint_every_minutes: float = 10.0  # §6.1 wrote checkpoints at 10-minute intervals
    keep_checkpoints: int = 20  # enough to average the last 20 (big)
    # Keep the best step beside the last keep_checkpoints (never rotated away; `--step
    # best` reads it): "loss" = validation loss (lower is better, every eval_every_steps),
    # "bleu" = validation sacreBLEU (higher is better, every bleu_every_steps; Multi30K
    # BLEU for a run trained on lowercased tokens, data.text_form); "f1" = a parsing run's
    # validation bracketing F1 (higher is better, every f1_every_steps); "" = off. With
    # optim.ema_decay each is the moving average's (train/loop.py): `--step best --ema`.
    keep_best_by: Literal["", "loss", "bleu", "f1"] = ""
    # How many steps saved as a new best to keep (the N most recent improvements, the
    # steps leading up to the best): `attnmt average --best N` averages them.
    keep_best_checkpoints: int = 1
    # >0: stop (with a checkpoint) after this many evaluations of keep_best_by in a row
    # without improvement on the best; 0 = never
    early_stop_patience: int = 0
    # `attnmt train` ends a finished run (not a preempted one) by scoring its newest
    # checkpoint on data.test_split, as `attnmt evaluate --split test` would
    test_at_end: bool = True
    max_consecutive_skips: int = 20  # non-finite updates in a row before the run stops
    memory_preflight: bool = True  # refuse, before training, a step that cannot fit in memory
    # Dropout's random bits: "threefry" (identical on every mesh) or "rbg" (XLA's
    # RngBitGenerator: cheaper per bit, deterministic per key, may differ across meshes).
    dropout_rng: Literal["threefry", "rbg"] = "threefry"
    # MFU in the logs = model TFLOP/s (attnmt.model.flops) ÷ (this × the devices of the
    # run's mesh). Use the accelerator's dense peak for the compute dtype, or
    # bench/matmul_ceiling.py on a CPU; 0 = log model TFLOP/s only.
    peak_tflops_per_device: float = 0.0
    profile_first_step: int = 0  # trace updates first+1 … first+num with jax.profiler
    profile_num_steps: int = 0  # 0 = no trace; written to <workdir>/profile
    # XLA backend (LLVM) optimisation level of the train/eval steps, 0-3; -1 = XLA's own.
    # With model.scan_layers, 1 cut the base step's compile on a 2-core CPU from 11.4 s to
    # 5.1 s at +6 % step time (BENCHMARKS.md): for short and debugging runs.
    xla_backend_optimization_level: OptimizationLevel = -1
    # Persistent compilation cache (attnmt/train/compile_cache.py): compiled steps are kept,
    # so a resumed run loads them instead of compiling again. "" = $JAX_COMPILATION_CACHE_DIR
    # when set, else <workdir>/compilation_cache (inside the workdir: JAX runs what the cache
    # holds, and the workdir is the folder the run owns); a folder or gs:// URL, which runs
    # may share (entries are keyed by program, flags and devices); "off" or "none" = none.
    compilation_cache_dir: str = ""
    # Updates whose batches a background thread gathers, counts and queues ahead of the one
    # running (attnmt/train/prefetch.py); 0 = drawn on the loop's own thread (debugging).
    prefetch_depth: int = 2
    # Clock- and signal-driven decisions (SIGTERM, time limit, time-based checkpoint) are
    # agreed by every process at most this many updates apart, and about once a second when
    # updates are slower (train/stopping.py). A SIGTERM is honoured at the first agreement
    # after it: within this many updates, or within the first update that ends 1 s after
    # it when updates take longer than 0.1 s. 10: one small all-gather per 50 ms at the
    # paper's 5 ms base step (a few % at worst on a pod's network), while a preemption's
    # grace period (30 s and more) is never at risk. A run of one process gathers nothing
    # and looks at its own signal and clock after every update.
    agree_every_steps: int = 10
    # A parsing model that copies its input's words (data.treebank_leaves="words"): train
    # and validate on the tree grammar's decisions only. Its decoding scores a word as the
    # probability of *any* word there and forces the word's pieces, so the plain loss would
    # spend capacity on which word comes next, which decoding never asks; with this, all
    # leaf pieces form one class (their log-probabilities summed), a word's later pieces
    # count nowhere, and brackets and EOS keep their own classes (train/loss.py).
    word_leaves_as_one_class: bool = False
    # >0: another dropout rate first. For the first early_dropout_steps updates the residual
    # and embedding dropout (model.dropout_rate) is early_dropout_rate instead, then
    # model.dropout_rate: a lower rate early lets a small-data model fit faster while it has
    # memorised little, the higher one holds it back once it would overfit (Liu et al. 2023
    # study both orders). The rate follows the state's step inside the compiled update, so
    # a resumed run switches at the same update as an uninterrupted one.
    early_dropout_steps: int = 0
    early_dropout_rate: float = 0.0

    def __post_init__(self) -> None:
        check_types(self, "train")
        positive = (
            "num_steps",
            "grad_accum_steps",
            "log_every_steps",
            "keep_checkpoints",
            "keep_best_checkpoints",
            "max_consecutive_skips",
            "agree_every_steps",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"train.{name} must be positive, got {getattr(self, name)}")
        for name in (
            "max_tokens_per_device",
            "time_limit_minutes",
            "eval_every_steps",
            "bleu_every_steps",
            "bleu_max_sentences",
            "f1_every_steps",
            "f1_max_sentences",
            "checkpoint_every_steps",
            "checkpoint_every_minutes",
            "peak_tflops_per_device",
            "profile_first_step",
            "profile_num_steps",
            "early_stop_patience",
            "prefetch_depth",
            "early_dropout_steps",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name} must be ≥ 0, got {getattr(self, name)}")
        if not 0.0 <= self.early_dropout_rate < 1.0:
            raise ConfigError(
                f"train.early_dropout_rate must be in [0, 1), got {self.early_dropout_rate}"
            )
        if self.early_dropout_rate and not self.early_dropout_steps:
            raise ConfigError(
                f"train.early_dropout_rate={self.early_dropout_rate} needs "
                "train.early_dropout_steps > 0: the updates it applies to"
            )
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(
                f"train.label_smoothing must be in [0, 1), got {self.label_smoothing}"
            )
        if self.checkpoint_every_steps == 0 and self.checkpoint_every_minutes == 0:
            raise ConfigError(
                "set train.checkpoint_every_steps or train.checkpoint_every_minutes: a run "
                "without periodic checkpoints can be lost"
            )
        self._check_best()

    @property
    def best_every_steps(self) -> int:
        """How often keep_best_by's evaluation runs (0 when keep_best_by is off)."""
        return getattr(self, _RANKED_EVERY[self.keep_best_by]) if self.keep_best_by else 0

    def _check_best(self) -> None:
        """keep_best_by needs the evaluation it ranks; patience and keep_best_checkpoints
        need something ranked."""
        needs = _RANKED_EVERY.get(self.keep_best_by)
        if needs and getattr(self, needs) == 0:
            raise ConfigError(
                f"train.keep_best_by={self.keep_best_by!r} needs train.{needs} > 0 (the "
                "evaluation it ranks checkpoints by)"
            )
        if self.keep_best_checkpoints > 1 and not self.keep_best_by:
            raise ConfigError(
                f"train.keep_best_checkpoints={self.keep_best_checkpoints} needs "
                'train.keep_best_by ("loss", "bleu" or "f1"): the metric that ranks them'
            )
        if self.early_stop_patience and not self.keep_best_by:
            raise ConfigError(
                'train.early_stop_patience needs train.keep_best_by ("loss", "bleu" or "f1"): '
                "the metric whose improvement it waits for"
            )


Algorithm = Literal["adam", "sgd"]


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    algorithm: Algorithm = "adam"  # the paper's; "sgd" for equivalence tests (train/optim.py)
    warmup_steps: int = 4000
    learning_rate_scale: float = 1.0  # multiplies the paper's formula (1.0 = the paper)
    beta1: float = 0.9
    beta2: float = 0.98
    epsilon: float = 1e-9
    max_grad_norm: float = 0.0  # 0 = no clipping, as in the paper
    # >0: over the last cooldown_steps updates before train.num_steps the rate falls
    # linearly from the paper's schedule to 0, so a short run ends on a settled model rather
    # than at the inverse-sqrt rate (a "warmup-stable-decay" ending); 0 = the paper's throughout.
    cooldown_steps: int = 0
    # >0: keep an exponential moving average of the parameters with this decay (its ramp:
    # train/optim.py). Validation also reports the average's loss (ema_* in the eval
    # metrics); `attnmt evaluate --ema` and `attnmt average --ema` decode with it, and so
    # does train.test_at_end. 0 = none (the paper averages checkpoints instead).
    ema_decay: float = 0.0
    # >0: decoupled weight decay (AdamW, Loshchilov & Hutter 2019): every update also moves
    # each weight matrix and embedding by -rate * weight_decay * value; biases and layer-norm
    # scales are not decayed (train/optim.py). 0 = none, as in the paper.
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        check_types(self, "optim")
        if self.weight_decay < 0:
            raise ConfigError(f"optim.weight_decay must be ≥ 0, got {self.weight_decay}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ConfigError(f"optim.ema_decay must be in [0, 1), got {self.ema_decay}")
        if self.warmup_steps <= 0:
            raise ConfigError(f"optim.warmup_steps must be positive, got {self.warmup_steps}")
        if self.learning_rate_scale <= 0:
            raise ConfigError(
                f"optim.learning_rate_scale must be positive, got {self.learning_rate_scale}"
            )
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"optim.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.cooldown_steps < 0:
            raise ConfigError(f"optim.cooldown_steps must be ≥ 0, got {self.cooldown_steps}")
        if self.epsilon <= 0 or self.max_grad_norm < 0:
            raise ConfigError("optim.epsilon must be > 0 and optim.max_grad_norm ≥ 0")
