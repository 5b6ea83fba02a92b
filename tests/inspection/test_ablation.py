"""Head ablation on a trained run: `ablate_heads` scores exactly the translations made with
that one head zeroed, `format_ablation` puts the largest drop first, and `attnmt attention`
writes those numbers (and the figures of the heads asked for).

The reference removes each head by hand, in a copy of the parameters (its rows of W^O set to
zero, written here, not with `without_head`), translates, and scores with sacrebleu itself.
The dev references are the full model's own translations, so the full model scores 100 and
every head whose removal changes a translation shows as a drop of its own size.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import jax
import numpy as np
import pytest
import sacrebleu

from attnmt.cli.main import main
from attnmt.decode.translate import Translator
from attnmt.inspection.ablation import HeadAblation, ablate_heads, format_ablation
from attnmt.workdir import load_run
from tests.helpers import corpus_paths, expected_kind_files, write_reversal_corpus

LAYERS, HEADS = 2, 4  # unequal, so a swapped layer and head index cannot pass
SENTENCES = 8
KINDS = ("encoder", "decoder", "cross")
LEVEL0 = "--config.train.xla_backend_optimization_level=0"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """80 updates on the reversal task: not learned, but the translations depend on the
    input and on every head (a random model repeats one piece whatever the input)."""
    root = tmp_path_factory.mktemp("ablation")
    corpus = write_reversal_corpus(root)
    workdir = root / "run"
    overrides = [
        *corpus_paths(corpus),
        "--config.data.max_length=16",
        "--config.data.min_bucket_length=16",  # one compiled shape
        "--config.model.vocab_size=32",
        f"--config.model.num_layers={LAYERS}",
        f"--config.model.num_heads={HEADS}",
        "--config.model.d_k=8",
        "--config.model.d_v=8",
        "--config.decode.max_len_offset=8",
        "--config.train.num_steps=80",
        "--config.train.eval_every_steps=0",
        "--config.train.checkpoint_every_steps=80",
        "--config.train.memory_preflight=false",
        LEVEL0,
        "--config.optim.warmup_steps=40",
        "--config.optim.learning_rate_scale=1.0",
    ]
    argv = ["train", "--config", "configs/tiny.py", "--workdir", str(workdir), *overrides]
    assert main(argv) == 0
    return workdir


def _zeroed(params, kind: str, layer: int, head: int):
    """A deep copy of per-layer `params` with head `head`'s rows of W^O set to zero."""
    copy = jax.tree_util.tree_map(np.array, params)
    stack = "encoder" if kind == "encoder" else "decoder"
    module = "cross_attention" if kind == "cross" else "self_attention"
    copy[f"{stack}_{layer}"][module]["out"]["kernel"][head] = 0.0
    # Placed as the loaded parameters, so the translator's compiled search is reused.
    return jax.device_put(copy, jax.tree_util.tree_map(lambda a: a.sharding, params))


def _bleu(hypotheses: list[str], references: list[str]) -> float:
    return sacrebleu.corpus_bleu(hypotheses, [references]).score


@dataclasses.dataclass
class Reference:
    run: object
    translator: Translator
    pairs: list[tuple[str, str]]
    full: list[str]
    bleu: dict[tuple[str, int, int], float]  # (kind, layer, head), 0-based → BLEU


@pytest.fixture(scope="module")
def reference(trained) -> Reference:
    """The full model's greedy translations of the dev sources become the dev references
    (so `attnmt attention --ablate --split dev` scores against them too); then the BLEU of
    each head's removal, computed by hand."""
    run = load_run(trained)
    decode = dataclasses.replace(
        run.experiment.decode, beam_size=1, xla_backend_optimization_level=0
    )  # what `--beam 1 --xla-opt-level 0` gives the command
    translator = Translator.from_runs([run], decode)
    corpus = trained.parent
    sources = (corpus / "dev.src").read_text().splitlines()[:SENTENCES]
    full = translator.translate(sources)
    assert len(set(full)) > SENTENCES // 2, full  # the translations depend on the input
    (corpus / "dev.src").write_text("\n".join(sources) + "\n")
    (corpus / "dev.tgt").write_text("\n".join(full) + "\n")
    bleu = {}
    for kind in KINDS:
        for layer in range(LAYERS):
            for head in range(HEADS):
                translator.set_params([_zeroed(run.params, kind, layer, head)])
                bleu[kind, layer, head] = _bleu(translator.translate(sources), full)
    translator.set_params([run.params])
    changed = [value for value in bleu.values() if value < 100.0]
    assert len(set(changed)) >= len(bleu) // 2, bleu  # most heads matter, each by its own
    return Reference(run, translator, list(zip(sources, full, strict=True)), full, bleu)


@contextlib.contextmanager
def counted_compiles() -> Iterator[list[str]]:
    """The XLA compiles that happen inside the block, one entry each."""
    compiles: list[str] = []

    def listener(event: str, seconds: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield compiles
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def test_ablate_heads_scores_each_head_removed_against_sacrebleu(reference):
    run = reference.run
    lines: list[str] = []
    with counted_compiles() as compiles:
        baseline, rows = ablate_heads(
            reference.translator,
            run.experiment.model,
            run.params,
            reference.pairs,
            _bleu,
            progress=lines.append,
        )
    # The parameters are arguments of the search the translator has compiled already: no
    # head's removal compiles it again (a 6-layer model would otherwise compile 18 times).
    assert compiles == []
    assert baseline == pytest.approx(100.0)  # the references are the full model's output
    assert [(r.kind, r.layer, r.head) for r in rows] == list(reference.bleu)
    for row in rows:
        expected = reference.bleu[row.kind, row.layer, row.head]
        assert row.bleu == pytest.approx(expected, abs=1e-9), row
        assert row.change == pytest.approx(expected - baseline, abs=1e-9), row
    assert len(lines) == len(rows) and lines[-1].startswith(f"cross layer {LAYERS} head {HEADS}:")
    # The translator is given the full model back.
    assert reference.translator.translate([s for s, _ in reference.pairs]) == reference.full
    # Only the kinds asked for.
    _, crossed = ablate_heads(
        reference.translator, run.experiment.model, run.params, reference.pairs, _bleu, ["cross"]
    )
    assert [(r.kind, r.layer, r.head, r.bleu) for r in crossed] == [
        (*key, value) for key, value in reference.bleu.items() if key[0] == "cross"
    ]


def _table_rows(table: str) -> list[list[str]]:
    return [line.split() for line in table.splitlines()[2:]]


def test_format_ablation_puts_the_largest_drop_first():
    rows = [
        HeadAblation("encoder", 0, 0, 30.0, -2.5),
        HeadAblation("decoder", 1, 2, 40.0, 7.5),
        HeadAblation("cross", 0, 1, 12.25, -20.25),
        HeadAblation("cross", 1, 0, 32.5, 0.0),
    ]
    table = format_ablation(32.5, rows, "sacrebleu")
    first, header = table.splitlines()[:2]
    assert first == "full model: sacrebleu 32.50"
    assert header.split() == ["kind", "layer", "head", "sacrebleu", "change"]
    assert _table_rows(table) == [  # layers and heads 1-based
        ["cross", "1", "2", "12.25", "-20.25"],
        ["encoder", "1", "1", "30.00", "-2.50"],
        ["cross", "2", "1", "32.50", "+0.00"],
        ["decoder", "2", "3", "40.00", "+7.50"],
    ]


def test_the_command_writes_the_ablation_and_the_figures_asked_for(trained, reference, capsys):
    out = trained.parent
    argv = ["attention", "--workdir", str(trained), "--beam", "1", "--xla-opt-level", "0"]
    ablation = out / "ablation"
    command = [*argv, "--ablate", "--split", "dev", "-n", str(SENTENCES), "--out", str(ablation)]
    assert main(command) == 0
    printed = capsys.readouterr().out
    baseline = 100.0
    with (ablation / "ablation.csv").open() as file:
        written = list(csv.DictReader(file))
    # One row per head of every kind, in kind / layer / head order, 1-based, holding the
    # BLEU of that head's removal and its change.
    assert [(r["kind"], int(r["layer"]), int(r["head"])) for r in written] == [
        (kind, layer + 1, head + 1) for kind, layer, head in reference.bleu
    ]
    for row, expected in zip(written, reference.bleu.values(), strict=True):
        assert float(row["bleu"]) == pytest.approx(expected, abs=1e-9), row
        assert float(row["change"]) == pytest.approx(expected - baseline, abs=1e-9), row
    # ablation.md: the same numbers, the largest drop first (ties in any order).
    markdown = (ablation / "ablation.md").read_text()
    assert markdown.startswith(f"{SENTENCES} sentences of 'dev', beam 1\n")
    table = markdown.split("```\n")[1].rstrip("\n")
    assert table in printed
    assert table.splitlines()[0] == "full model: sacrebleu 100.00"
    shown = _table_rows(table)
    changes = [float(change) for *_, change in shown]
    assert changes == sorted(changes) and changes[0] < changes[-1]
    expected_rows = [
        [kind, str(layer + 1), str(head + 1), f"{bleu:.2f}", f"{bleu - baseline:+.2f}"]
        for (kind, layer, head), bleu in reference.bleu.items()
    ]
    assert sorted(shown) == sorted(expected_rows)
    assert (ablation / "ablation.png").read_bytes()[:4] == b"\x89PNG"

    # Figures of what --kind / --layer / --head (1-based) / --query (0-based) select.
    figures = out / "figures"
    selection = ["--kind", "cross", "--layer", "2", "--head", "3", "--query", "0"]
    assert main([*argv, "--text", "a b c d", *selection, "--out", str(figures)]) == 0
    printed = capsys.readouterr().out
    assert "translation:" in printed and "entropy" in printed
    expected = expected_kind_files("cross", (2,), (3,), query=1)
    expected |= {"alignment.png", "statistics.png", "statistics.csv", "index.md"}
    assert {path.name for path in figures.iterdir()} == expected
    pngs = sorted(figures.glob("*.png"))
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    index = (figures / "index.md").read_text()
    assert all(f"[{p.name}]({p.name})" in index for p in pngs)

    assert main([*argv, "--out", str(ablation)]) == 2  # neither --text nor --ablate
    assert "either --text" in capsys.readouterr().err
    assert main([*argv, "--text", "a b", "--query", "99", "--out", str(figures)]) == 2
    err = capsys.readouterr().err
    assert "query" in err and "Traceback" not in err
