"""The arrays of a training or evaluation batch, named once for data, model, steps and
shardings.

Every batch holds right-padded token rows. A packed batch (data.pack_length > 0) holds
several examples per row and says which is which: segment ids (1, 2, … along the row, 0 on
padding) and each token's position inside its own example.
"""

TOKEN_KEYS = ("src_tokens", "tgt_tokens")
PACKING_KEYS = ("src_segments", "tgt_segments", "src_positions", "tgt_positions")


def batch_keys(packed: bool) -> tuple[str, ...]:
    return TOKEN_KEYS + PACKING_KEYS if packed else TOKEN_KEYS


def packing_arguments(batch: dict) -> dict:
    """The packing arrays of `batch` as keyword arguments of Transformer.__call__ (none for
    a batch of one example per row)."""
    return {key: batch[key] for key in PACKING_KEYS if key in batch}
