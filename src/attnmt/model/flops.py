"""Model FLOPs of the Transformer's matmuls, for utilisation (MFU) in logs and benchmarks.

Counts follow the architecture, not the compiled program: what a real token needs.
`padded_train_flops` counts what a padded batch makes the hardware compute instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnmt.common import PAD_ID


def nonpad_lengths(tokens: np.ndarray) -> np.ndarray:
    """Real (non-PAD) tokens per row; all-PAD filler rows count 0."""
    return (np.asarray(tokens) != PAD_ID).sum(axis=1)


def example_lengths(batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) real tokens of each example: one per row, or one per segment of a
    packed row (whose attention spans only its own example)."""
    if "src_segments" not in batch:
        return nonpad_lengths(batch["src_tokens"]), nonpad_lengths(batch["tgt_tokens"])
    src, tgt = np.asarray(batch["src_segments"]), np.asarray(batch["tgt_segments"])
    width = int(max(src.max(initial=0), tgt.max(initial=0))) + 1
    size = len(src) * width

    def counts(segments: np.ndarray) -> np.ndarray:
        keys = np.arange(len(segments))[:, None] * width + segments
        return np.bincount(keys[segments > 0], minlength=size)

    src_counts, tgt_counts = counts(src), counts(tgt)
    present = (src_counts > 0) | (tgt_counts > 0)
    return src_counts[present], tgt_counts[present]


def forward_flops_parts(
    model: Any, src_lengths: np.ndarray, tgt_lengths: np.ndarray
) -> dict[str, float]:
    """Matmul FLOPs of one teacher-forced forward pass, counting real tokens only.

    One multiply-add is 2 FLOPs. With d = d_model, h heads, V vocabulary and,
    per sentence, s real source and t real target tokens (both including EOS; the decoder
    sees t positions: BOS + t−1 tokens), summed over model.encoder_layers and
    model.decoder_layers:

      encoder, per layer:  s · 2·(d·h·(2·d_k + d_v) + h·d_v·d)          Q, K, V, output
                         + s · 2·(2·d·d_ff)  (3·d·d_ff if gated)       FFN
                         + s · s · 2·h·(d_k + d_v)                     scores + values
      decoder, per layer:  t · 2·(d·h·(2·d_k + d_v) + h·d_v·d)          self Q, K, V, out
                         + t · 2·(d·h·d_k + h·d_v·d)                   cross Q, out
                         + s · 2·(d·h·(d_k + d_v))                     cross K, V (source)
                         + t(t+1)/2 · 2·h·(d_k + d_v)                  causal self scores+values
                         + t · s · 2·h·(d_k + d_v)                     cross scores + values
                         + t · 2·(2·d·d_ff)  (3·d·d_ff if gated)       FFN
      output projection:   t · 2·V·d                                   shared embedding

    Only work that a real token needs is counted: no padding positions, no masked
    (future) keys, no embedding lookups (gathers), softmax, layer norms or loss.
    Returns {"dense": weight matmuls in the stacks, "attention": scores + weighted values,
    "output": the vocabulary projection}.
    """
    s = np.asarray(src_lengths, np.float64)
    t = np.asarray(tgt_lengths, np.float64)
    c = model
    d, h, dk, dv = c.d_model, c.num_heads, c.d_k, c.d_v
    qkvo = d * h * (2 * dk + dv) + h * dv * d
    ffn = (3 if c.gated_ffn else 2) * d * c.d_ff  # W1 (and the gate V), W2
    attend = 2 * h * (dk + dv)  # per (query, key) pair: scores and weighted values
    encoder_dense = s * 2 * (qkvo + ffn)
    decoder_dense = (
        t * 2 * (qkvo + ffn)  # self-attention and FFN
        + t * 2 * (d * h * dk + h * dv * d)  # cross-attention queries and output
        + s * 2 * d * h * (dk + dv)  # cross-attention keys and values
    )
    encoder_attention = s * s * attend
    decoder_attention = t * (t + 1) / 2 * attend + t * s * attend
    n_enc, n_dec = c.encoder_layers, c.decoder_layers
    return {
        "dense": float(np.sum(n_enc * encoder_dense + n_dec * decoder_dense)),
        "attention": float(np.sum(n_enc * encoder_attention + n_dec * decoder_attention)),
        "output": float(np.sum(t * 2 * c.vocab_size * d)),
    }


def forward_flops(model: Any, src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> float:
    """The sum of forward_flops_parts."""
    return sum(forward_flops_parts(model, src_lengths, tgt_lengths).values())


def train_flops(model: Any, src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> float:
    """Forward + backward: the backward pass costs two forwards (input and weight grads)."""
    return 3.0 * forward_flops(model, src_lengths, tgt_lengths)


def padded_forward_flops(model: Any, rows: int, src_len: int, tgt_len: int) -> float:
    """Forward matmul FLOPs of a padded [rows, src_len] × [rows, tgt_len] batch as computed:
    every position, and the full (unmasked) square of causal self-attention scores."""
    c = model
    src = np.full(rows, src_len, np.float64)
    tgt = np.full(rows, tgt_len, np.float64)
    masked_half = (tgt * tgt - tgt * (tgt + 1) / 2) * 2 * c.num_heads * (c.d_k + c.d_v)
    return forward_flops(c, src, tgt) + float(c.decoder_layers * np.sum(masked_half))


def batch_train_flops(model: Any, batch: dict[str, np.ndarray]) -> tuple[float, float]:
    """(useful FLOPs on real tokens, FLOPs of every padded position with full attention)."""
    useful = train_flops(model, *example_lengths(batch))
    rows, src_len = batch["src_tokens"].shape
    full = 3.0 * padded_forward_flops(model, rows, src_len, batch["tgt_tokens"].shape[1])
    return useful, full
