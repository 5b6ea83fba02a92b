"""What one sentence pair looks like to the model: tokens of both sides and the attention
weights of every kind, layer and head (the paper's appendix figures, for any run).

Kinds: "encoder" (encoder self-attention), "decoder" (masked decoder self-attention) and
"cross" (encoder-decoder attention). Decoder rows are labelled with the token each
position predicts, so a cross-attention row is the alignment of that output token; the
keys of decoder self-attention are the decoder's inputs (`<s>` and the target shifted
right). Works for per-layer and scanned parameters (model.inspect converts the layout).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from attnmt.common import EOS_ID
from attnmt.config.model import ModelConfig
from attnmt.data.tokenizer import Tokenizer
from attnmt.inspection.capture import attention_maps
from attnmt.model.transformer import Transformer

KINDS = ("encoder", "decoder", "cross")
_MODULES = {"encoder": "self_attention", "decoder": "self_attention", "cross": "cross_attention"}
_STACKS = {"encoder": "encoder", "decoder": "decoder", "cross": "decoder"}


def module_name(kind: str, layer: int) -> str:
    """The attention module's name in the per-layer parameters ("decoder_2/cross_attention")."""
    check_kind(kind)
    return f"{_STACKS[kind]}_{layer}/{_MODULES[kind]}"


def stack_of(kind: str) -> str:
    """The stack ("encoder" or "decoder") whose layers hold `kind`'s attention."""
    check_kind(kind)
    return _STACKS[kind]


def check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown attention kind {kind!r}; choose one of {', '.join(KINDS)}")


@dataclasses.dataclass(frozen=True)
class AttentionView:
    source: list[str]  # source pieces, EOS included
    target: list[str]  # target pieces, EOS included: what each decoder position predicts
    weights: dict[str, np.ndarray]  # kind → float32 [layers, heads, queries, keys]

    @property
    def decoder_input(self) -> list[str]:
        """The decoder's input at each position: `<s>`, then the target shifted right."""
        return ["<s>", *self.target[:-1]]

    def depth(self, kind: str) -> int:
        """The layers `kind`'s attention has: its stack's depth (model.encoder_layers or
        model.decoder_layers)."""
        check_kind(kind)
        return self.weights[kind].shape[0]

    @property
    def deepest(self) -> int:
        """The deeper stack's depth: the range a layer number given for every kind spans."""
        return max(self.depth(kind) for kind in KINDS)

    @property
    def num_heads(self) -> int:
        return self.weights["encoder"].shape[1]

    def queries(self, kind: str) -> list[str]:
        check_kind(kind)
        return self.source if kind == "encoder" else self.target

    def keys(self, kind: str) -> list[str]:
        check_kind(kind)
        return self.decoder_input if kind == "decoder" else self.source

    def head(self, kind: str, layer: int, head: int) -> np.ndarray:
        """[queries, keys] weights of one head; each row sums to 1."""
        check_kind(kind)
        return self.weights[kind][layer, head]


def view_from_ids(
    config: ModelConfig,
    params: Any,
    src_ids: list[int],
    tgt_ids: list[int],
    src_pieces: list[str],
    tgt_pieces: list[str],
) -> AttentionView:
    """The view of one pair of id sequences (EOS included on both sides)."""
    if not src_ids or not tgt_ids or src_ids[-1] != EOS_ID or tgt_ids[-1] != EOS_ID:
        raise ValueError("source and target ids must be non-empty and end with EOS")
    src, tgt = np.asarray([src_ids], np.int32), np.asarray([tgt_ids], np.int32)
    maps = attention_maps(Transformer(config), params, src, tgt)
    weights = {
        kind: np.stack(
            [
                maps[module_name(kind, layer)][0]
                for layer in range(config.stack_depth(stack_of(kind)))
            ]
        ).astype(np.float32)
        for kind in KINDS
    }
    return AttentionView(list(src_pieces), list(tgt_pieces), weights)


def attention_view(
    config: ModelConfig,
    params: Any,
    tokenizer: Tokenizer,
    text: str,
    translation: str,
) -> AttentionView:
    """The view of `text` and `translation` (e.g. the model's own, from Translator)."""
    if not text.strip():
        raise ValueError("the source text is empty")
    src_ids = [*tokenizer.encode(text), EOS_ID]
    # (The target side's own model, where the vocabulary has one per side.)
    tgt_ids = [*tokenizer.encode_target_batch([translation])[0], EOS_ID]
    longest = max(len(src_ids), len(tgt_ids))
    if config.positional == "learned" and longest > config.max_length:
        raise ValueError(
            f"{longest} tokens exceed the model's maximum length of {config.max_length}"
        )
    return view_from_ids(
        config, params, src_ids, tgt_ids, tokenizer.pieces(src_ids), tokenizer.pieces(tgt_ids)
    )
