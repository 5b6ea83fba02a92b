"""`attnmt import` and `attnmt export`: Hugging Face Marian models and CTranslate2."""

from __future__ import annotations

import argparse

from attnmt.cli.arguments import Overrides, local_path
from attnmt.config.overrides import only_section
from attnmt.errors import ConfigError


def _cmd_import(args: argparse.Namespace, overrides: Overrides) -> int:
    from attnmt.interop.hf_import import import_marian

    only_section("import", overrides, None)
    experiment = import_marian(args.hf_dir, args.workdir)
    model = experiment.model
    print(
        f"imported {args.hf_dir} into {args.workdir}: {model.encoder_layers} encoder and "
        f"{model.decoder_layers} decoder layers, d_model "
        f"{model.d_model}, {model.vocab_size} pieces, {model.activation}"
    )
    return 0


def _cmd_export(args: argparse.Namespace, overrides: Overrides) -> int:

    only_section("export", overrides, None)
    if args.format == "hf":
        from attnmt.interop.hf_export import export_marian

        if args.quantization is not None:
            raise ConfigError("--quantization applies to --format ctranslate2 only")
        out = export_marian(args.workdir, args.out, args.step)
    else:
        from attnmt.interop.ctranslate2 import export_ctranslate2

        out = export_ctranslate2(args.workdir, args.out, args.quantization or "float32", args.step)
    print(f"exported {args.workdir} as {args.format} to {out}")
    from attnmt.workdir import load_experiment

    form = load_experiment(args.workdir, args.step).data.text_form
    if form != "raw":
        print(
            f"note: this run was trained with data.text_form={form!r}: the exported model "
            "expects its input in that form (lowercased, Moses-tokenized) and emits it"
        )
    return 0


def add_command(commands: argparse._SubParsersAction) -> None:
    imp = commands.add_parser(
        "import", help="a Hugging Face MarianMT directory (save_pretrained) → a workdir"
    )
    imp.add_argument(
        "hf_dir",
        type=local_path("the folder to import"),
        help="folder with config.json, weights, vocab.json, *.spm",
    )
    imp.add_argument("--workdir", required=True, type=local_path("this command's --workdir"))
    imp.set_defaults(handler=_cmd_import)

    exp = commands.add_parser("export", help="a workdir's model for Hugging Face or CTranslate2")
    exp.add_argument("--workdir", required=True, type=local_path("this command's --workdir"))
    exp.add_argument("--step", type=int, default=None, help="checkpoint step (default newest)")
    exp.add_argument("--format", required=True, choices=("hf", "ctranslate2"))
    exp.add_argument("--out", required=True, type=local_path("--out"), help="output folder")
    exp.add_argument(
        "--quantization", default=None, help="ctranslate2 only: float32 (default), int8, …"
    )
    exp.set_defaults(handler=_cmd_export)
