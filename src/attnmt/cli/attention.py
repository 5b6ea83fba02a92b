"""`attnmt attention`: figures of a run's attention for a sentence, or head ablation.

attnmt attention --workdir W --text "A man is riding a bike ." --out figures/
attnmt attention --workdir W --text "…" --translation "…" --kind cross --layer 6 --out F
attnmt attention --workdir W --ablate --split val -n 200 --beam 1 --out ablation/
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from attnmt.cli.arguments import Overrides, add_decode_arguments, decode_config, load_runs
from attnmt.errors import ConfigError
from attnmt.storage import local_only


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "attention", help="attention figures for a sentence, or BLEU change per ablated head"
    )
    add_decode_arguments(parser)
    parser.add_argument("--out", required=True, help="folder for the figures / tables")
    parser.add_argument("--text", default=None, help="the source sentence")
    parser.add_argument("--translation", default=None, help="default: the model's own")
    parser.add_argument("--kind", action="append", choices=("encoder", "decoder", "cross"))
    parser.add_argument("--layer", type=int, action="append", help="1-based; repeatable")
    parser.add_argument("--head", type=int, action="append", help="1-based; repeatable")
    parser.add_argument("--query", type=int, default=None, help="0-based query token index")
    parser.add_argument("--ablate", action="store_true", help="remove one head at a time")
    parser.add_argument("--split", default=None, help="for --ablate; default: eval split")
    parser.add_argument("-n", type=int, default=100, help="for --ablate: sentences used")
    parser.set_defaults(handler=run_attention)


def _zero_based(values: list[int] | None, count: int, what: str) -> list[int] | None:
    if values is None:
        return None
    bad = [v for v in values if not 1 <= v <= count]
    if bad:
        raise ConfigError(f"--{what} {bad[0]} is outside 1..{count}")
    return [v - 1 for v in values]


def run_attention(args: argparse.Namespace, overrides: Overrides) -> int:
    if args.ensemble:
        raise ConfigError("attnmt attention looks at one model: drop --ensemble")
    if args.ablate == (args.text is not None):
        raise ConfigError("give either --text (figures) or --ablate (head ablation)")
    run = load_runs(args)[0]
    from attnmt.decode.translate import Translator

    translator = Translator.from_runs([run], decode_config(run, args, overrides))
    # Figures are saved by matplotlib to local files: copy them to a bucket afterwards.
    out = Path(local_only(args.out, "attnmt attention --out"))
    out.mkdir(parents=True, exist_ok=True)
    if args.ablate:
        return _ablate(run, translator, args, out)
    return _figures(run, translator, args, out)


def _figures(run, translator, args: argparse.Namespace, out: Path) -> int:
    from attnmt.data.text_form import TextForm
    from attnmt.decode.translate import decoding_model_config
    from attnmt.inspection.files import write_figures
    from attnmt.inspection.stats import format_table, head_statistics
    from attnmt.inspection.view import KINDS, attention_view

    translation = args.translation
    if translation is None:
        translation = translator.translate([args.text])[0]
    try:
        model = decoding_model_config(run.experiment.model, translator.decode_config)
        # The model reads its data.text_form (lowercased tokens for "lc.norm.tok").
        form = TextForm.of(run.experiment.data)
        source, target = form.source(args.text), form.target(translation)
        view = attention_view(model, run.params, run.tokenizer, source, target)
        rows = head_statistics([view])
        written = write_figures(
            view,
            out,
            kinds=tuple(args.kind) if args.kind else KINDS,
            layers=_zero_based(args.layer, view.deepest, "layer"),
            heads=_zero_based(args.head, view.num_heads, "head"),
            query=args.query,
            statistics_rows=rows,
        )
    except ValueError as error:  # an empty or too long sentence, a query out of range
        raise ConfigError(f"{error}") from None
    print(f"source:      {args.text}")
    print(f"translation: {translation}")
    print(format_table(rows))
    print(f"{len(written)} files in {out} (index: {out / 'index.md'})")
    return 0


def _ablate(run, translator, args: argparse.Namespace, out: Path) -> int:
    from attnmt.data.prepare import load_split
    from attnmt.decode.evaluation import score, scores_multi30k_bleu
    from attnmt.inspection.ablation import ablate_heads, ablation_figure, format_ablation

    experiment = run.experiment
    split = args.split or experiment.data.eval_split
    pairs = load_split(experiment.data, split, as_trained=False)[: args.n]
    metric = "multi30k_bleu" if scores_multi30k_bleu(experiment) else "sacrebleu"

    def bleu(hypotheses: list[str], references: list[str]) -> float:
        sacre, _, m30k = score(experiment, hypotheses, references)
        return m30k.score if m30k is not None else sacre.score

    baseline, rows = ablate_heads(
        translator,
        experiment.model,
        run.params,
        pairs,
        bleu,
        kinds=tuple(args.kind) if args.kind else ("encoder", "decoder", "cross"),
        progress=lambda line: print(line, file=sys.stderr),
    )
    with (out / "ablation.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=["kind", "layer", "head", "bleu", "change"])
        writer.writeheader()
        for row in rows:
            writer.writerow({**row.row(), "layer": row.layer + 1, "head": row.head + 1})
    table = format_ablation(baseline, rows, metric)
    (out / "ablation.md").write_text(
        f"{len(pairs)} sentences of {split!r}, beam {translator.decode_config.beam_size}\n\n"
        f"```\n{table}\n```\n"
    )
    figure = ablation_figure(baseline, rows, metric)
    figure.savefig(out / "ablation.png", dpi=110)
    print(table)
    print(f"tables and chart in {out}")
    return 0
