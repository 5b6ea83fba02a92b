"""Logical axis names: the contract between the model and the sharding rules.

The model annotates every parameter and main activation with these names only; the
mapping to physical mesh axes lives in `attnmt.parallel.sharding`, so switching between
data, FSDP and tensor parallelism never touches model code.
"""

BATCH = "batch"  # sentences in a batch (times beams when decoding)
LENGTH = "length"  # query positions
KV_LENGTH = "kv_length"  # key/value positions
EMBED = "embed"  # d_model
HEADS = "heads"  # h
KV = "kv"  # d_k or d_v, per head
MLP = "mlp"  # d_ff
VOCAB = "vocab"  # shared vocabulary
LAYERS = "layers"  # the stacked layers of model.scan_layers=True

ALL = (BATCH, LENGTH, KV_LENGTH, EMBED, HEADS, KV, MLP, VOCAB, LAYERS)
