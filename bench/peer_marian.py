"""attnmt against a peer: Hugging Face MarianMTModel of the same size, on the same batches.

    python bench/peer_marian.py --json results.json
    python bench/peer_marian.py --configs multi30k --dtypes float32,bfloat16
    python bench/peer_marian.py --smoke

Marian in transformers is the closest PyTorch relative of the paper's model: post-norm
residual blocks, sinusoidal positions, embeddings scaled by √d_model, one embedding
matrix shared by encoder, decoder and the output projection. It is built from a
MarianConfig with our sizes (d_model, layers, d_ff, heads, vocabulary, dropout, the
model's activation: ReLU), mapped as the Hugging Face export maps them
(attnmt.interop.marian_config.marian_kwargs), and random weights, and trained with
Adam(0.9, 0.98, 1e-9) on label-smoothed (0.1) cross-entropy over the non-PAD target
tokens, like attnmt. Differences that remain, and are small: Marian's attention
projections (Q, K, V, output) carry biases, its logits get a (zero, untrained)
final-logits bias, and it requires d_k = d_v = d_model / heads.

Both run on identical host batches (train_throughput.build_workload), one after the other
in this process, attnmt first. torch float32, and bfloat16 under torch.autocast, eager
by default (--torch-compile tries torch.compile on the model). The FLOPs and tokens are
counted with the same formula for both, so the tokens/s ratio is also the FLOP/s ratio.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import common
import numpy as np
import train_throughput

from attnmt.common import BOS_ID, EOS_ID, PAD_ID
from attnmt.interop.marian_config import head_size_problem, marian_kwargs


def import_peer() -> tuple[Any, Any] | None:
    """(torch, transformers) or None, saying why, when either is missing or broken."""
    try:
        import torch
        import transformers
    except ImportError as error:
        print(
            f"skipping the Marian peer: {error}. Install it with `pip install -e '.[bench]'`.",
            file=sys.stderr,
        )
        return None
    return torch, transformers


def marian_config(model: Any, max_positions: int) -> Any:
    """A MarianConfig with attnmt's sizes (model: attnmt ModelConfig), through the mapping
    the Hugging Face export writes (attnmt.interop.marian_config), with attnmt's own token
    ids: the peer is fed attnmt's batches as they are."""
    from transformers import MarianConfig

    problem = head_size_problem(model)
    if problem:
        raise ValueError(f"Marian needs d_k = d_v = d_model / heads: {problem}")
    kwargs = marian_kwargs(
        model,
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        decoder_start_id=BOS_ID,
        forced_eos_id=None,  # generate() must not force an EOS we did not ask for
        max_positions=max_positions,
    )
    return MarianConfig(**kwargs, bos_token_id=BOS_ID)


def build_marian(model: Any, max_positions: int, seed: int = 0) -> Any:
    import torch
    from transformers import MarianMTModel

    torch.manual_seed(seed)
    config = marian_config(model, max_positions)
    config._attn_implementation = "sdpa"  # PyTorch's fused attention: the fastest eager path
    return MarianMTModel(config)


def trainable_parameters(module: Any) -> int:
    """Unique trainable parameters (tied matrices counted once)."""
    seen = {id(p): p.numel() for p in module.parameters() if p.requires_grad}
    return sum(seen.values())


def make_adam(torch: Any, parameters: Any) -> Any:
    kwargs = {"lr": 1e-4, "betas": (0.9, 0.98), "eps": 1e-9}
    try:
        # The fused kernel is torch's fastest Adam on CPU (as attnmt's update is one jit).
        return torch.optim.Adam(parameters, fused=True, **kwargs)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(parameters, foreach=True, **kwargs)


def to_torch(torch: Any, batch: dict[str, np.ndarray]) -> dict[str, Any]:
    src = torch.from_numpy(batch["src_tokens"].astype(np.int64))
    tgt = torch.from_numpy(batch["tgt_tokens"].astype(np.int64))
    # Teacher forcing exactly as attnmt's shift_right: BOS, then the target minus its last.
    decoder_input = torch.cat([torch.full_like(tgt[:, :1], BOS_ID), tgt[:, :-1]], dim=1)
    return {
        "src": src,
        "src_mask": (src != PAD_ID).long(),
        "decoder_input": decoder_input,
        "decoder_mask": (decoder_input != PAD_ID).long(),
        "tgt": tgt,
        "tokens": int((tgt != PAD_ID).sum()),
    }


def time_marian(
    workload: train_throughput.Workload,
    *,
    min_steps: int,
    min_seconds: float,
    warmup: int,
    max_seconds: float = 600.0,
    compile_model: bool = False,
    label_smoothing: float = 0.1,
) -> dict[str, Any]:
    import torch
    from torch.nn import functional

    cfg = workload.model
    longest = max(max(b["src_tokens"].shape[1], b["tgt_tokens"].shape[1]) for b in workload.batches)
    marian = build_marian(cfg, max(512, longest + 2))
    marian.train()
    params = trainable_parameters(marian)
    optimizer = make_adam(torch, marian.parameters())
    forward = torch.compile(marian) if compile_model else marian
    bf16 = cfg.dtype == "bfloat16"
    batches = [to_torch(torch, b) for b in workload.batches]

    def train_step(batch: dict[str, Any]) -> float:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = forward(
                input_ids=batch["src"],
                attention_mask=batch["src_mask"],
                decoder_input_ids=batch["decoder_input"],
                decoder_attention_mask=batch["decoder_mask"],
            ).logits
        loss = functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]),
            batch["tgt"].reshape(-1),
            ignore_index=PAD_ID,
            label_smoothing=label_smoothing,
            reduction="sum",
        ) / max(batch["tokens"], 1)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    # The first step allocates Adam's moments (and compiles, with --torch-compile).
    start = time.perf_counter()
    train_step(batches[0])
    first_step = time.perf_counter() - start
    for i in range(warmup):
        train_step(batches[(1 + i) % len(batches)])

    seconds: list[float] = []
    useful = tokens = 0.0
    index = (1 + warmup) % len(batches)
    loss = 0.0
    while train_throughput.keep_timing(seconds, min_steps, min_seconds, max_seconds):
        start = time.perf_counter()
        loss = train_step(batches[index])  # float() waits for the step to finish
        seconds.append(time.perf_counter() - start)
        tokens += batches[index]["tokens"]
        useful += common.batch_train_flops(cfg, workload.batches[index])[0]
        index = (index + 1) % len(batches)
    if not np.isfinite(loss):
        print(f"WARNING: Marian {workload.config_name}: non-finite loss", file=sys.stderr)
    total = sum(seconds)
    timings = common.Timings(seconds)
    return {
        "impl": "marian" + ("+compile" if compile_model else ""),
        "config": workload.config_name,
        "dtype": cfg.dtype,
        "data": workload.data,
        "params": params,
        "first_step_s": first_step,
        "steps": len(seconds),
        "step_ms": timings.median * 1e3,
        "step_ms_range": timings.spread(),
        "tgt_tok_per_s": tokens / total,
        "gflops": useful / total / 1e9,
    }


def attnmt_parameters(model: Any) -> int:
    from attnmt.model.param_count import count_parameters

    return count_parameters(model)["total"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    train_throughput.add_workload_args(parser)
    # bfloat16 is opt-in: on a CPU without native bf16 (AVX2 only) torch's bf16 matmuls
    # run at a few GFLOP/s and one base-model step takes minutes.
    parser.set_defaults(configs=["multi30k", "wmt14_ende"], dtypes=["float32"], warmup=1)
    parser.add_argument("--torch-compile", action="store_true", help="also torch.compile(model)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    common.add_output_args(parser)
    args = parser.parse_args()
    if args.smoke:
        train_throughput.apply_smoke(args)

    info = common.machine_info()
    common.print_machine(info)
    peer = import_peer()
    if peer is None:
        return
    torch, _ = peer
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch threads: {torch.get_num_threads()}", file=sys.stderr)
    common.warn_if_busy(info)

    rows, ratios = [], []
    for config_name in args.configs:
        for dtype in args.dtypes:
            workload = train_throughput.workload_from_args(args, config_name, dtype)
            timing = {
                "min_steps": args.min_steps,
                "min_seconds": args.min_seconds,
                "warmup": args.warmup,
                "max_seconds": args.max_seconds,
            }
            ours = train_throughput.time_attnmt(workload, **timing)
            ours["params"] = attnmt_parameters(workload.model)
            rows.append(ours)
            peers = [False, True] if args.torch_compile else [False]
            for compile_model in peers:
                try:
                    theirs = time_marian(workload, compile_model=compile_model, **timing)
                except ValueError as error:  # a size Marian cannot express
                    print(f"skipping Marian for {config_name}: {error}", file=sys.stderr)
                    continue
                rows.append(theirs)
                ratios.append(
                    {
                        "config": config_name,
                        "dtype": dtype,
                        "peer": theirs["impl"],
                        "step_time_ratio": ours["step_ms"] / theirs["step_ms"],
                        "tok_per_s_ratio": ours["tgt_tok_per_s"] / theirs["tgt_tok_per_s"],
                    }
                )
            print(f"  {config_name} {dtype} done", file=sys.stderr)
    columns = ["impl", "config", "dtype", "data", "params", "compile_all_s", "first_step_s"]
    print(common.markdown_table(rows, [*columns, "step_ms", "tgt_tok_per_s", "gflops"]))
    print("\nattnmt / peer (tokens/s ratio > 1: attnmt is faster)\n")
    print(common.markdown_table(ratios, ["config", "dtype", "peer", "tok_per_s_ratio"]))
    common.append_json(args.json, "peer_marian", args, rows + ratios)


if __name__ == "__main__":
    main()
