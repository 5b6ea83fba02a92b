# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: -all
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Looking inside: attention of a Transformer translation model
#
# The paper's appendix (Figures 3-5 of *Attention Is All You Need*) shows encoder
# self-attention in layer 5 of 6 of a trained model: heads that follow a long-distance
# dependency ("making ... more difficult"), heads that seem to resolve anaphora ("its"), and
# heads that follow the structure of the sentence. This notebook draws the same pictures,
# and a few more, for any attnmt run.
#
# - Set `ATTNMT_WORKDIR` to a trained run (e.g. `runs/m30k`) to look at that model. It
#   translates `ATTNMT_SENTENCE` itself, unless you give the translation in
#   `ATTNMT_TRANSLATION` (to see how the model attends on a reference translation).
# - Without it, a small random model with made-up tokens is used: enough to see what each
#   figure shows and how the masks shape it, not what a trained model learns.
#
# Layers and heads are numbered from 1 in titles, as in the paper, and from 0 in the code
# (`layer=4` is "layer 5").
#
# The next cell installs attnmt where it is missing (e.g. on Colab) from the source that
# `ATTNMT_SOURCE` names: this project's git URL or a folder holding a checkout. attnmt is
# not on the package index (a package of that name there would be someone else's), so
# without `ATTNMT_SOURCE` the cell stops and prints the command to run.

# %%
import importlib.util
import os
import subprocess
import sys
import tempfile

if importlib.util.find_spec("attnmt") is None:
    source = os.environ.get("ATTNMT_SOURCE")
    if not source:
        print(
            "attnmt is not installed. Install it from this project's source, then rerun:\n"
            '    %pip install "attnmt[viz] @ git+https://github.com/OWNER/attnmt.git"\n'
            '    %pip install "/path/to/attnmt[viz]"      # a checkout\n'
            "or set ATTNMT_SOURCE to that git URL or folder. Never `pip install attnmt`: "
            "a package of that name on the index is not this project."
        )
        raise SystemExit(1)
    if "://" in source:  # a git URL (pip needs git+ in front)
        url = source if source.startswith("git+") else f"git+{source}"
        requirement = f"attnmt[viz] @ {url}"
    else:  # a folder: a path, so pip never looks the name up on the index
        folder = os.path.abspath(os.path.expanduser(source))
        if not os.path.isfile(os.path.join(folder, "pyproject.toml")):
            raise SystemExit(f"ATTNMT_SOURCE={source}: no attnmt checkout (pyproject.toml) there")
        requirement = f"{folder}[viz]"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", requirement], check=True)
    importlib.invalidate_caches()  # see what pip just installed
elif importlib.util.find_spec("matplotlib") is None:
    # attnmt is here already; only its viz extra's figure library is missing.
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "matplotlib>=3.8"]
    subprocess.run(pip, check=True)
    importlib.invalidate_caches()

# %%
# Jupyter displays a matplotlib Figure that a cell returns once the inline backend is on.
# %matplotlib inline

# %% [markdown]
# ## A sentence and its translation
#
# `view` holds the tokens of both sides and the attention weights of every kind, layer and
# head: `view.weights["encoder"]` is `[layers, heads, queries, keys]`.
#
# - **encoder**: encoder self-attention; queries and keys are the source tokens.
# - **decoder**: masked decoder self-attention; a row is labelled with the target token
#   that position predicts, a column with the decoder's input (`<s>`, then the target
#   shifted right). Nothing above the diagonal: a position sees only earlier inputs.
# - **cross**: encoder-decoder attention; a row per predicted target token, a column per
#   source token.

# %%
import flax.linen as nn
import jax
import jax.numpy as jnp
from IPython.display import display

from attnmt.common import EOS_ID
from attnmt.config.model import ModelConfig
from attnmt.inspection.figures import (
    alignment_figure,
    head_figure,
    layer_figure,
    model_figure,
    query_figure,
    statistics_figure,
)
from attnmt.inspection.files import write_figures
from attnmt.inspection.stats import format_table, head_statistics
from attnmt.inspection.view import KINDS, attention_view, view_from_ids
from attnmt.model.transformer import Transformer

SENTENCE = os.environ.get("ATTNMT_SENTENCE", "A man in a blue shirt is standing on a ladder .")
TRANSLATION = os.environ.get("ATTNMT_TRANSLATION", "")
WORKDIR = os.environ.get("ATTNMT_WORKDIR")

if WORKDIR:
    from attnmt.config.decode import DecodeConfig
    from attnmt.decode.translate import Translator
    from attnmt.workdir import load_run

    run = load_run(WORKDIR)
    config, params, tokenizer = run.experiment.model, run.params, run.tokenizer
    if not TRANSLATION:
        translator = Translator([config], [params], tokenizer, DecodeConfig(batch_sentences=1))
        TRANSLATION = translator.translate([SENTENCE])[0]
    view = attention_view(config, params, tokenizer, SENTENCE, TRANSLATION)
else:
    # A random model, and made-up ids standing for the words of a made-up translation.
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
    TRANSLATION = TRANSLATION or "Ein Mann in einem blauen Hemd steht auf einer Leiter ."
    source_words, target_words = SENTENCE.split(), TRANSLATION.split()
    src_ids = [4 + i % 60 for i in range(len(source_words))] + [EOS_ID]
    tgt_ids = [4 + (7 * i) % 60 for i in range(len(target_words))] + [EOS_ID]
    init_tokens = jnp.ones((1, 8), jnp.int32)
    variables = Transformer(config).init(jax.random.PRNGKey(0), init_tokens, init_tokens)
    params = nn.meta.unbox(variables["params"])
    view = view_from_ids(
        config, params, src_ids, tgt_ids, [*source_words, "</s>"], [*target_words, "</s>"]
    )

LAST_LAYER = view.deepest - 1  # both stacks are 2 deep here
print("source:     ", " ".join(view.source))
print("translation:", " ".join(view.target))
print(f"{view.depth('encoder')} + {view.depth('decoder')} layers × {view.num_heads} heads")

# %% [markdown]
# ## One head
#
# A heat map of one head: each **row is a query** (the token doing the looking), each
# **column a key** (the token looked at), and a cell's colour the weight that query gives
# that key. Every row sums to 1. A bright diagonal is a head attending to the token itself;
# one just beside it attends to the previous (or next) token; a bright last column (`</s>`)
# is a head with nothing to do, parking its weight on the end of the sentence.

# %%
head_figure(view, "encoder", LAST_LAYER, 0)

# %% [markdown]
# ## Every head of a layer
#
# The heads of one layer on one colour scale, so they can be compared: with multi-head
# attention (§3.2.2) each head can attend to something different. Query tokens label the
# left edge, key tokens the bottom. Here the decoder's masked self-attention: the upper
# triangle is empty because a position may only attend to earlier ones (§3.2.3).

# %%
layer_figure(view, "decoder", LAST_LAYER)

# %% [markdown]
# ## The whole model at a glance
#
# Thumbnails of every layer (rows) and head (columns), each on its own colour scale: a
# quick way to spot the heads worth opening (diagonals, stripes, a column on `</s>`).

# %%
model_figure(view, "encoder")

# %% [markdown]
# ## One word, all heads: the paper's appendix view
#
# Figures 3-5 of the paper: the query tokens in the left column, the key tokens in the
# right one, and lines from one chosen query word (in red) to every key, one colour per
# head. The stronger the weight, the more opaque and wider the line (the strongest line of
# the figure is opaque). Figure 3 shows many heads of layer 5 following "making" to
# "more difficult".

# %%
middle_word = (len(view.source) - 2) // 2
query_figure(view, "encoder", LAST_LAYER, middle_word)

# %% [markdown]
# ## Source-translation alignment
#
# Encoder-decoder attention averaged over the heads of every layer (or of one, with
# `layer=`): for each translation token (row), where in the source (columns) the decoder
# looked while predicting it. In a trained model this is close to a word alignment.

# %%
alignment_figure(view)

# %% [markdown]
# ## Per-head statistics
#
# One line per head, each value averaged over the query positions (pass more views to
# `head_statistics` to average over sentences too):
#
# - `entropy` (nats): 0 when a query puts all weight on one key, ln(keys) when uniform;
# - `distance`: mean |query − key| position under the weights (self-attention only);
# - `previous` / `same` / `next`: weight on the key just before, at or after the query;
# - `special`: weight on the sentence boundary (`</s>` for source keys, `<s>` for the
#   decoder's own), where idle heads park it.
#
# In the figure, a layers × heads map per kind and statistic; blank cells are undefined
# (positions in two different sentences are not comparable).

# %%
rows = head_statistics([view])
print(format_table(rows))

# %%
statistics_figure(rows)

# %% [markdown]
# ## Pick a kind, layer and head
#
# With ipywidgets installed, sliders choose the head to draw; without it, the last layer of
# every kind is drawn instead.

# %%
try:
    import ipywidgets
except ImportError:
    ipywidgets = None

if ipywidgets is not None:

    def show_head(kind: str, layer: int, head: int):
        """The head picked with the sliders (1-based, as in the titles)."""
        return head_figure(view, kind, layer - 1, head - 1)

    ipywidgets.interact(
        show_head,
        kind=list(KINDS),
        layer=ipywidgets.IntSlider(value=view.deepest, min=1, max=view.deepest),
        head=ipywidgets.IntSlider(value=1, min=1, max=view.num_heads),
    )
else:
    for kind in KINDS:
        display(layer_figure(view, kind, view.depth(kind) - 1))

# %% [markdown]
# ## Writing the figures to files
#
# `write_figures` saves PNGs of a selection (every head of the chosen layers and kinds, each
# layer, the overview, the query view, the alignment and the statistics) with an
# `index.md` captioning each file. Set `ATTNMT_FIGURES_DIR` to keep them; here only the
# last layer's first head is written, to a temporary folder.

# %%
figures_dir = os.environ.get("ATTNMT_FIGURES_DIR") or tempfile.mkdtemp(prefix="attention-")
written = write_figures(view, figures_dir, layers=[LAST_LAYER], heads=[0], statistics_rows=rows)
print(f"{len(written)} files in {figures_dir}:", ", ".join(path.name for path in written))
