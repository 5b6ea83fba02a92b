"""Equivalence and memory per mesh: 3 train steps of one model on 1 device and on 8 (fake)
devices under several meshes; prints the largest relative parameter/loss difference from
the 1-device run and the bytes of parameters + optimizer state held per device.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/mesh_equivalence.py
"""

from __future__ import annotations

import argparse
import dataclasses
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import numpy as np

from attnmt.common import EOS_ID, PAD_ID
from attnmt.config.experiment import Experiment
from attnmt.config.model import ModelConfig
from attnmt.config.parallel import ParallelConfig
from attnmt.config.train import OptimConfig
from attnmt.parallel.mesh import make_mesh
from attnmt.parallel.sharding import bytes_per_device, put_batch
from attnmt.train.program import build_program

MESHES = {
    "1 device": (ParallelConfig(data=1), 1),
    "dp=8": (ParallelConfig(data=8), 8),
    "fsdp=8": (ParallelConfig(data=1, fsdp=8), 8),
    "dp=4 tp=2": (ParallelConfig(data=4, tensor=2), 8),
    "dp=2 fsdp=2 tp=2": (ParallelConfig(data=2, fsdp=2, tensor=2), 8),
    "fsdp=2 tp=4": (ParallelConfig(data=1, fsdp=2, tensor=4), 8),
}


def _batches(vocab: int, rows: int, length: int, count: int = 3) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(count):
        batch = {}
        for name in ("src_tokens", "tgt_tokens"):
            tokens = rng.integers(4, vocab, size=(rows, length)).astype(np.int32)
            for row, n in enumerate(rng.integers(2, length + 1, size=rows)):
                tokens[row, n - 1], tokens[row, n:] = EOS_ID, PAD_ID
            batch[name] = tokens
        batches.append(batch)
    return batches


def run(config: ModelConfig, parallel: ParallelConfig, devices: int, batches: list) -> tuple:
    experiment = dataclasses.replace(
        Experiment.from_mapping({}), model=config, optim=OptimConfig(warmup_steps=4)
    )
    program = build_program(experiment, make_mesh(parallel, jax.devices()[:devices]))
    state = program.init_state()
    held = max(bytes_per_device((state.params, state.opt_state)).values())
    losses = []
    for batch in batches:
        state, metrics = program.train_step(state, put_batch(batch, program.mesh))
        losses.append(float(metrics["loss"]))
    return state, np.array(losses), held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=8000)
    args = parser.parse_args()
    config = ModelConfig(
        vocab_size=args.vocab,
        d_model=args.d_model,
        d_ff=4 * args.d_model,
        num_heads=8,
        d_k=args.d_model // 8,
        d_v=args.d_model // 8,
        num_layers=args.layers,
        dropout_rate=0.1,
    )
    batches = _batches(args.vocab, rows=32, length=16)
    reference = None
    print("| mesh | max rel. param diff | max rel. loss diff | params+Adam bytes/device |")
    print("|---|---|---|---|")
    for name, (parallel, devices) in MESHES.items():
        state, losses, held = run(config, parallel, devices, batches)
        if reference is None:
            reference = (state, losses)
        ref_state, ref_losses = reference
        param_diff = max(
            float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / max(np.max(np.abs(b)), 1e-12))
            for a, b in zip(
                jax.tree_util.tree_leaves(state.params),
                jax.tree_util.tree_leaves(ref_state.params),
                strict=True,
            )
        )
        loss_diff = float(np.max(np.abs(losses - ref_losses) / np.abs(ref_losses)))
        print(f"| {name} | {param_diff:.1e} | {loss_diff:.1e} | {held / 2**20:.2f} MiB |")


if __name__ == "__main__":
    main()
