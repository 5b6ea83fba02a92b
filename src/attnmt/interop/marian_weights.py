"""MarianMTModel's state dict (torch layout, as NumPy arrays) ↔ attnmt's parameter tree.

Torch's Linear stores `weight` as [out, in]; attnmt's kernels are [in, …out] with the heads
as their own axis. The vocabulary rows (embedding, final_logits_bias) are permuted between
Marian's and attnmt's id orders (interop/vocab_order.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from attnmt.config.model import ModelConfig
from attnmt.errors import CheckpointError

# attnmt sub-layer → Marian module, per stack
_ENCODER_PARTS = {
    "self_attention": "self_attn",
    "self_attention_residual/norm": "self_attn_layer_norm",
    "ffn_residual/norm": "final_layer_norm",
}
_DECODER_PARTS = {
    **_ENCODER_PARTS,
    "cross_attention": "encoder_attn",
    "cross_attention_residual/norm": "encoder_attn_layer_norm",
}
_PROJECTIONS = {"query": "q_proj", "key": "k_proj", "value": "v_proj", "out": "out_proj"}


def _pairs(config: ModelConfig) -> Iterator[tuple[str, str, str]]:
    """(attnmt path, Marian key, kind) of every layer parameter; kind says how to convert."""
    stacks = (("encoder", _ENCODER_PARTS), ("decoder", _DECODER_PARTS))
    for stack, parts in stacks:
        for i in range(config.stack_depth(stack)):
            ours, theirs = f"{stack}_{i}", f"model.{stack}.layers.{i}"
            for part, module in parts.items():
                if part.endswith("norm"):
                    yield f"{ours}/{part}/scale", f"{theirs}.{module}.weight", "copy"
                    yield f"{ours}/{part}/bias", f"{theirs}.{module}.bias", "copy"
                    continue
                for name, proj in _PROJECTIONS.items():
                    kind = "out" if name == "out" else "in"
                    mine, hf = f"{ours}/{part}/{name}", f"{theirs}.{module}.{proj}"
                    yield f"{mine}/kernel", f"{hf}.weight", kind
                    yield f"{mine}/bias", f"{hf}.bias", kind + "_b"
            for dense, fc in (("wi", "fc1"), ("wo", "fc2")):
                yield f"{ours}/ffn/{dense}/kernel", f"{theirs}.{fc}.weight", "dense"
                yield f"{ours}/ffn/{dense}/bias", f"{theirs}.{fc}.bias", "copy"


def _to_attnmt(kind: str, w: np.ndarray, config: ModelConfig) -> np.ndarray:
    h, d = config.num_heads, config.d_model
    if kind == "in":  # [h·dk, d] → [d, h, dk]
        return w.T.reshape(d, h, -1)
    if kind == "in_b":
        return w.reshape(h, -1)
    if kind == "out":  # [d, h·dv] → [h, dv, d]
        return w.T.reshape(h, -1, d)
    if kind == "dense":
        return w.T
    return w  # "copy", "out_b"


def _to_marian(kind: str, w: np.ndarray) -> np.ndarray:
    if kind in ("in", "out", "dense"):  # inverse reshapes: flatten all but the model axis
        flat = w.reshape(w.shape[0], -1) if kind == "in" else w.reshape(-1, w.shape[-1])
        return flat.T
    return w.reshape(-1) if kind == "in_b" else w


def _tied_embedding(state: dict[str, np.ndarray]) -> np.ndarray:
    shared = state.get("model.shared.weight")
    if shared is None:
        raise CheckpointError("the weights hold no model.shared.weight (the shared embedding)")
    for key in (
        "lm_head.weight",
        "model.encoder.embed_tokens.weight",
        "model.decoder.embed_tokens.weight",
    ):
        if key in state and not np.array_equal(state[key], shared):
            raise CheckpointError(
                f"{key} differs from model.shared.weight: untied embeddings "
                "(tie_word_embeddings / share_encoder_decoder_embeddings) are not supported"
            )
    return shared


def params_from_marian(
    state: dict[str, np.ndarray], config: ModelConfig, order: np.ndarray
) -> dict[str, Any]:
    """attnmt parameters (per-layer layout) of a Marian state dict; `order[a]` is the
    Marian id of attnmt id `a`."""
    flat: dict[str, np.ndarray] = {}
    for ours, theirs, kind in _pairs(config):
        if theirs not in state:
            raise CheckpointError(f"the weights hold no {theirs}")
        flat[ours] = _to_attnmt(kind, np.asarray(state[theirs], np.float32), config)
    flat["embed/embedding"] = np.asarray(_tied_embedding(state), np.float32)[order]
    bias = state.get("final_logits_bias", np.zeros((1, config.vocab_size), np.float32))
    flat["final_logits_bias"] = np.asarray(bias, np.float32).reshape(-1)[order]
    tree: dict[str, Any] = {}
    for path, value in flat.items():
        node = tree
        *parents, leaf = path.split("/")
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = np.ascontiguousarray(value)
    return tree


def _get(tree: dict[str, Any], path: str) -> np.ndarray | None:
    node: Any = tree
    for name in path.split("/"):
        if not isinstance(node, dict) or name not in node:
            return None
        node = node[name]
    return np.asarray(node, np.float32)


def marian_from_params(
    params: dict[str, Any], config: ModelConfig, order: np.ndarray
) -> dict[str, np.ndarray]:
    """The Marian state dict (as save_pretrained writes it) of per-layer attnmt parameters;
    `order[m]` is the attnmt id of Marian id `m`. Missing biases (model.attention_bias,
    model.final_logits_bias off) are written as zeros, which computes the same."""
    state: dict[str, np.ndarray] = {}
    for ours, theirs, kind in _pairs(config):
        value = _get(params, ours)
        if value is None:  # only biases may be absent
            shape = {"in_b": (config.d_model,), "out_b": (config.d_model,)}.get(kind)
            if shape is None:
                raise CheckpointError(f"the parameters hold no {ours}")
            state[theirs] = np.zeros(shape, np.float32)
            continue
        state[theirs] = np.ascontiguousarray(_to_marian(kind, value))
    state["model.shared.weight"] = np.ascontiguousarray(_get(params, "embed/embedding")[order])
    bias = _get(params, "final_logits_bias")
    bias = np.zeros(config.vocab_size, np.float32) if bias is None else bias[order]
    state["final_logits_bias"] = np.ascontiguousarray(bias[None, :])
    return state
