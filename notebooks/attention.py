# %% [markdown]
# # Looking at attention
#
# The paper's appendix (Figures 3-5) shows encoder self-attention in layer 5 of 6: heads
# that follow a long-distance dependency, heads that resolve anaphora, heads that follow
# sentence structure. This notebook shows the same maps for any attnmt workdir.
#
# Set `ATTNMT_WORKDIR` to a trained run (e.g. `runs/m30k`); without it a small random model
# is used, which is enough to see the shapes and masks. Open with Jupyter via jupytext
# (`jupytext --to notebook notebooks/attention.py`) or run it as a script.

# %%
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attnmt.model.config import ModelConfig
from attnmt.model.inspect import attention_maps
from attnmt.model.transformer import Transformer
from attnmt.special_tokens import EOS_ID

SENTENCE = os.environ.get("ATTNMT_SENTENCE", "A man in a blue shirt is standing on a ladder .")
TRANSLATION = os.environ.get("ATTNMT_TRANSLATION", "")

workdir = os.environ.get("ATTNMT_WORKDIR")
if workdir:
    from attnmt.decode.config import DecodeConfig
    from attnmt.decode.translate import Translator
    from attnmt.workdir import load_run

    run = load_run(workdir)
    config, params, tokenizer = run.experiment.model, run.params, run.tokenizer
    if not TRANSLATION:
        translator = Translator([config], [params], tokenizer, DecodeConfig(batch_sentences=1))
        TRANSLATION = translator.translate([SENTENCE])[0]
    src_ids = [*tokenizer.encode(SENTENCE), EOS_ID]
    tgt_ids = [*tokenizer.encode(TRANSLATION), EOS_ID]
    src_pieces = tokenizer.pieces(src_ids)
else:
    config = ModelConfig(
        vocab_size=64,
        d_model=32,
        d_ff=64,
        num_heads=4,
        d_k=8,
        d_v=8,
        num_layers=2,
        dropout_rate=0.0,
    )
    words = SENTENCE.split()
    src_ids = [4 + i % 60 for i in range(len(words))] + [EOS_ID]
    tgt_ids = [4 + (7 * i) % 60 for i in range(len(words))] + [EOS_ID]
    src_pieces = [*words, "</s>"]
    init_tokens = jnp.ones((1, 8), jnp.int32)
    variables = Transformer(config).init(jax.random.PRNGKey(0), init_tokens, init_tokens)
    params = nn.meta.unbox(variables["params"])

maps = attention_maps(Transformer(config), params, jnp.array([src_ids]), jnp.array([tgt_ids]))
print({name: weights.shape for name, weights in maps.items()})

# %% [markdown]
# Encoder self-attention of the last layer (the paper shows layer 5 of 6), every head:
# each row is a query position, each column the position it attends to.

# %%
last_encoder = f"encoder_{config.num_layers - 1}/self_attention"
weights = maps[last_encoder][0]  # [heads, q_len, kv_len]


def text_heatmap(matrix: np.ndarray, labels: list[str]) -> str:
    shades = " .:-=+*#%@"
    rows = []
    for label, row in zip(labels, matrix, strict=True):
        cells = "".join(shades[min(int(value * len(shades)), len(shades) - 1)] for value in row)
        rows.append(f"{label[:12]:>12} |{cells}|")
    return "\n".join(rows)


for head in range(weights.shape[0]):
    print(f"head {head}")
    print(text_heatmap(weights[head], src_pieces))

# %%
try:
    import matplotlib.pyplot as plt
except ImportError:
    plt = None
if plt is not None:
    figure, panels = plt.subplots(1, weights.shape[0], figsize=(4 * weights.shape[0], 4))
    for head, panel in enumerate(np.atleast_1d(panels)):
        panel.imshow(weights[head], cmap="viridis")
        panel.set_xticks(range(len(src_pieces)), src_pieces, rotation=90)
        panel.set_yticks(range(len(src_pieces)), src_pieces)
        panel.set_title(f"{last_encoder}, head {head}")
    figure.tight_layout()
