"""Attention figures show the weights of the view they are given, labelled with its tokens,
and write_figures writes exactly the files of the selection, each listed in index.md."""

from __future__ import annotations

import csv
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("matplotlib")

from attnmt.common import EOS_ID
from attnmt.inspection.figures import (
    alignment_figure,
    head_figure,
    layer_figure,
    model_figure,
    query_figure,
    statistics_figure,
)
from attnmt.inspection.files import write_figures
from attnmt.inspection.stats import STATISTICS, head_statistics
from attnmt.inspection.view import KINDS, view_from_ids
from attnmt.model.transformer import Transformer
from tests.helpers import expected_kind_files, tiny_model

SOURCE = ["▁a", "▁man", "▁on", "▁a", "▁ladder", "</s>"]
TARGET = ["▁ein", "▁Mann", "▁auf", "▁Leiter", "</s>"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def view():
    config = tiny_model(vocab_size=20, d_model=32, d_k=16, d_v=16)
    tokens = jnp.ones((1, 6), jnp.int32)
    variables = Transformer(config).init(jax.random.PRNGKey(0), tokens, tokens)
    params = nn.meta.unbox(variables["params"])
    src_ids, tgt_ids = [5, 6, 7, 5, 8, EOS_ID], [9, 10, 11, 12, EOS_ID]
    return view_from_ids(config, params, src_ids, tgt_ids, SOURCE, TARGET)


def texts(labels) -> list[str]:
    return [label.get_text() for label in labels]


def test_head_figure_draws_that_head_with_token_labels(view):
    figure = head_figure(view, "decoder", 1, 0)
    heat, colour_bar = figure.axes
    assert heat.get_title() == "decoder self-attention · layer 2 · head 1"
    np.testing.assert_array_equal(heat.images[0].get_array(), view.head("decoder", 1, 0))
    assert texts(heat.get_yticklabels()) == TARGET  # queries on rows
    assert texts(heat.get_xticklabels()) == ["<s>", *TARGET[:-1]]  # keys on columns
    assert heat.get_xlabel() == "key (decoder input)"
    assert colour_bar.get_ylabel() == "attention weight"


def test_layer_figure_has_one_panel_per_head_labelled_outside(view):
    figure = layer_figure(view, "encoder", 0)
    assert len(figure.axes) == view.num_heads + 1  # + the shared colour bar
    first, second = figure.axes[:2]
    assert figure.get_suptitle() == "encoder self-attention · layer 1"
    assert [first.get_title(), second.get_title()] == ["head 1", "head 2"]
    assert texts(first.get_yticklabels()) == SOURCE
    assert texts(first.get_xticklabels()) == SOURCE  # one row of panels: all at the bottom
    assert not any(label.get_visible() and label.get_text() for label in second.get_yticklabels())
    for head, ax in enumerate((first, second)):
        np.testing.assert_array_equal(ax.images[0].get_array(), view.head("encoder", 0, head))


def test_model_figure_shows_every_layer_and_head_without_ticks(view):
    figure = model_figure(view, "cross")
    assert len(figure.axes) == view.depth("encoder") * view.num_heads
    assert [ax.get_title() for ax in figure.axes] == ["head 1", "head 2", "", ""]
    assert [ax.get_ylabel() for ax in figure.axes] == ["layer 1", "", "layer 2", ""]
    assert all(not ax.get_xticks().size and not ax.get_yticks().size for ax in figure.axes)
    np.testing.assert_array_equal(figure.axes[3].images[0].get_array(), view.head("cross", 1, 1))


def test_query_figure_links_one_query_to_every_key_per_head(view):
    figure = query_figure(view, "cross", 1, 2)
    queries_ax, keys_ax = figure.axes
    assert texts(queries_ax.get_yticklabels()) == TARGET
    assert texts(keys_ax.get_yticklabels()) == SOURCE
    assert queries_ax.get_title() == "encoder-decoder attention · layer 2 · query 3: ▁auf"
    assert len(queries_ax.collections) == view.num_heads
    weights = view.weights["cross"][1, :, 2]  # [heads, keys]
    for head, lines in enumerate(queries_ax.collections):
        assert len(lines.get_segments()) == len(SOURCE)
        np.testing.assert_allclose(lines.get_colors()[:, 3], weights[head] / weights.max())
    legend = figure.legends[0]
    assert texts(legend.get_texts()) == ["head 1", "head 2"]
    with pytest.raises(ValueError, match="query"):
        query_figure(view, "cross", 1, len(TARGET))


def test_alignment_figure_averages_cross_attention(view):
    heat = alignment_figure(view).axes[0]
    expected = view.weights["cross"].mean(axis=(0, 1))
    np.testing.assert_allclose(heat.images[0].get_array(), expected, rtol=1e-6)
    assert texts(heat.get_xticklabels()) == SOURCE
    assert texts(heat.get_yticklabels()) == TARGET
    one_layer = alignment_figure(view, layer=1).axes[0]
    np.testing.assert_allclose(
        one_layer.images[0].get_array(), view.weights["cross"][1].mean(0), rtol=1e-6
    )
    assert "layer 2" in one_layer.get_title()


def test_statistics_figure_has_a_map_per_kind_and_statistic(view):
    rows = head_statistics([view])
    figure = statistics_figure(rows)
    maps = figure.axes[: len(KINDS) * len(STATISTICS)]
    assert len(figure.axes) == len(maps) + len(STATISTICS)  # + a colour bar per statistic
    assert [ax.get_title() for ax in maps[: len(STATISTICS)]] == list(STATISTICS)
    cross_distance = np.ma.filled(maps[2 * len(STATISTICS) + 1].images[0].get_array(), np.nan)
    assert np.all(np.isnan(cross_distance))  # blank: undefined across two sentences
    entropy = maps[0].images[0].get_array()
    assert entropy.shape == (view.depth("encoder"), view.num_heads)
    assert entropy[1, 0] == pytest.approx(next(r.entropy for r in rows if r.layer == 1))
    assert len(maps[0].texts) == view.depth("encoder") * view.num_heads  # small grid: annotated


def test_write_figures_writes_every_figure_and_an_index(view, tmp_path):
    rows = head_statistics([view])
    paths = write_figures(view, tmp_path, statistics_rows=rows)
    expected = {"alignment.png", "statistics.png", "statistics.csv", "index.md"}
    expected |= expected_kind_files("encoder", (1, 2), (1, 2), query=3)  # "▁on", mid-source
    for kind in ("decoder", "cross"):
        expected |= expected_kind_files(kind, (1, 2), (1, 2), query=2)  # "▁Mann"
    assert {path.name for path in paths} == expected
    assert {path.name for path in tmp_path.iterdir()} == expected
    pngs = [path for path in paths if path.suffix == ".png"]
    assert all(path.read_bytes()[:8] == PNG_SIGNATURE for path in pngs)
    sizes = {path.stat().st_size for path in pngs}
    assert min(sizes) > 1000 and len(sizes) > len(pngs) // 2  # different pictures
    index = (tmp_path / "index.md").read_text(encoding="utf-8")
    assert all(f"[{path.name}]({path.name})" in index for path in pngs)
    with (tmp_path / "statistics.csv").open() as file:
        assert len(list(csv.DictReader(file))) == len(rows)


def test_write_figures_narrows_to_the_selection(view, tmp_path):
    paths = write_figures(view, tmp_path, kinds=["encoder"], layers=[1], heads=[0], query=0)
    expected = expected_kind_files("encoder", (2,), (1,), query=1) | {"index.md"}
    assert {path.name for path in paths} == expected
    assert {path.name for path in tmp_path.iterdir()} == expected
    with pytest.raises(ValueError, match="layer"):
        write_figures(view, tmp_path, layers=[2])
    with pytest.raises(ValueError, match="unknown attention kind"):
        write_figures(view, tmp_path, kinds=["self"])


def test_missing_matplotlib_names_the_extra(view, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'attnmt\[viz\]'"):
        head_figure(view, "encoder", 0, 0)


def test_stacks_of_different_depths_draw_their_own_layers(tmp_path):
    # A 3-layer encoder under a 1-layer decoder: the decoder and cross kinds have one layer.
    config = tiny_model(
        vocab_size=20, d_model=32, d_k=16, d_v=16, num_encoder_layers=3, num_decoder_layers=1
    )
    tokens = jnp.ones((1, 6), jnp.int32)
    variables = Transformer(config).init(jax.random.PRNGKey(0), tokens, tokens)
    params = nn.meta.unbox(variables["params"])
    src_ids, tgt_ids = [5, 6, 7, 5, 8, EOS_ID], [9, 10, 11, 12, EOS_ID]
    uneven = view_from_ids(config, params, src_ids, tgt_ids, SOURCE, TARGET)
    assert [uneven.depth(kind) for kind in KINDS] == [3, 1, 1] and uneven.deepest == 3
    with pytest.raises(ValueError, match="layer 1 is out of range"):
        head_figure(uneven, "cross", 1, 0)
    rows = head_statistics([uneven])
    assert len(rows) == (3 + 1 + 1) * config.num_heads
    paths = write_figures(uneven, tmp_path, heads=[0], statistics_rows=rows)
    expected = {"alignment.png", "statistics.png", "statistics.csv", "index.md"}
    expected |= expected_kind_files("encoder", (1, 2, 3), (1,), query=3)
    for kind in ("decoder", "cross"):
        expected |= expected_kind_files(kind, (1,), (1,), query=2)
    assert {path.name for path in paths} == expected
