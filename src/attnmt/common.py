"""The contract every layer imports: special token ids, the arrays of a batch, and the
logical axis names. Plain values with no dependencies, so data code without jax, the
model, the steps and the sharding rules all share them.
"""

from __future__ import annotations

import dataclasses

# Special token ids: the vocabulary reserves them (data/tokenizer.py), the model pads,
# masks and starts the target with them, decoding starts and stops on them.
PAD_ID = 0  # padding: masked out of attention and of the loss
EOS_ID = 1  # end of sentence: ends every source and target sequence
BOS_ID = 2  # beginning of sentence: the decoder's first input, never emitted
UNK_ID = 3  # a piece outside the vocabulary
NUM_SPECIAL_TOKENS = 4  # ids below this are the ones above; pieces start here

# The arrays of a training or evaluation batch. Every batch holds right-padded token rows.
# A packed batch (data.pack_length > 0) holds several examples per row and says which is
# which: segment ids (1, 2, … along the row, 0 on padding) and each token's position inside
# its own example.
TOKEN_KEYS = ("src_tokens", "tgt_tokens")
PACKING_KEYS = ("src_segments", "tgt_segments", "src_positions", "tgt_positions")


def batch_keys(packed: bool) -> tuple[str, ...]:
    return TOKEN_KEYS + PACKING_KEYS if packed else TOKEN_KEYS


def packing_arguments(batch: dict) -> dict:
    """The packing arrays of `batch` as keyword arguments of Transformer.__call__ (none for
    a batch of one example per row)."""
    return {key: batch[key] for key in PACKING_KEYS if key in batch}


@dataclasses.dataclass(frozen=True)
class _LogicalAxes:
    """Logical axis names: the contract between the model and the sharding rules.

    The model annotates every parameter and main activation with these names only; the
    mapping to physical mesh axes lives in attnmt/parallel/sharding.py, so switching between
    data, FSDP and tensor parallelism never touches model code.
    """

    BATCH: str = "batch"  # sentences in a batch (times beams when decoding)
    LENGTH: str = "length"  # query positions
    KV_LENGTH: str = "kv_length"  # key/value positions
    EMBED: str = "embed"  # d_model
    HEADS: str = "heads"  # h
    KV: str = "kv"  # d_k or d_v, per head
    MLP: str = "mlp"  # d_ff
    VOCAB: str = "vocab"  # shared vocabulary
    LAYERS: str = "layers"  # the stacked layers of model.scan_layers=True

    @property
    def ALL(self) -> tuple[str, ...]:  # noqa: N802 (read as a constant, like the names)
        return tuple(getattr(self, field.name) for field in dataclasses.fields(self))


axes = _LogicalAxes()
