"""CTranslate2 decoding speed on the forced-length workload of decode_speed.py (b).

    python bench/ctranslate2_speed.py --json results.json
    python bench/ctranslate2_speed.py --quantizations float32,int8 --beams 4,1
    python bench/ctranslate2_speed.py --smoke

A model of the config's size (Multi30K by default) with random weights and the options an
imported Marian model has, written by attnmt's Hugging Face export (interop/hf_export.py)
and converted by CTranslate2's own converter, once per quantization. The sources are
decode_speed.py's (256 random sentences of --src-len tokens); every output is forced to
--out-len decoder steps by min_decoding_length = max_decoding_length, so the cost is the
same whatever the weights, as for attnmt and generate in decode_speed.py. Run both
scripts with the same flags for one table. One translator thread (intra_threads, and
inter_threads 1): pin the process to the cores you mean to measure (taskset).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common
import decode_speed
import numpy as np

from attnmt.common import EOS_ID, PAD_ID, UNK_ID
from attnmt.config.model import ModelConfig
from attnmt.interop.hf_export import write_marian_dir

MARIAN_OPTIONS = {
    "positional_layout": "halves",
    "layer_norm_epsilon": 1e-5,
    "attention_bias": True,
    "final_logits_bias": True,
    "decoder_start_id": PAD_ID,
    "zero_pad_embedding": True,
}


def _pieces(size: int) -> list[str]:
    names = {PAD_ID: "<pad>", EOS_ID: "</s>", UNK_ID: "<unk>"}
    return [names.get(i, f"▁p{i}") for i in range(size)]


def _tiny_spm(folder: Path) -> Path:
    """A valid sentencepiece model for the export's source.spm / target.spm: the workload
    feeds pieces, so these only need to load."""
    import sentencepiece as spm

    lines = [f"p{i} p{i + 1} p{i + 2}" for i in range(200)]
    prefix = folder / "tiny"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(prefix),
        vocab_size=40,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


def convert(config: ModelConfig, folder: Path, quantizations: list[str]) -> dict[str, Path]:
    from ctranslate2.converters import TransformersConverter

    params = decode_speed.random_params(config)
    params["embed"]["embedding"] = params["embed"]["embedding"].at[PAD_ID].set(0.0)
    spm_file = _tiny_spm(folder)
    hf = write_marian_dir(
        folder / "hf", config, params, _pieces(config.vocab_size), (spm_file, spm_file)
    )
    out = {}
    for quantization in quantizations:
        out[quantization] = folder / f"ct2-{quantization}"
        TransformersConverter(str(hf)).convert(
            str(out[quantization]), quantization=quantization, force=True
        )
    return out


def ct2_forced(
    model_dir: Path,
    quantization: str,
    sources: list[list[str]],
    *,
    beam: int,
    batch: int,
    out_len: int,
    repeats: int,
) -> dict[str, Any]:
    import ctranslate2

    translator = ctranslate2.Translator(
        str(model_dir), device="cpu", compute_type=quantization, intra_threads=1, inter_threads=1
    )

    def run() -> Any:
        return translator.translate_batch(
            sources,
            max_batch_size=batch,
            beam_size=beam,
            min_decoding_length=out_len,
            max_decoding_length=out_len,
            return_end_token=True,
        )

    start = time.perf_counter()
    results = run()
    first_s = time.perf_counter() - start
    lengths = {len(r.hypotheses[0]) for r in results}
    if lengths != {out_len}:
        raise AssertionError(f"CTranslate2 produced lengths {sorted(lengths)}, not {out_len}")
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    return decode_speed._forced_row(
        "ctranslate2", quantization, beam, batch, len(sources), out_len, first_s, seconds
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="multi30k", help="model size")
    parser.add_argument("--quantizations", type=common.str_list, default=["float32", "int8"])
    parser.add_argument("--beams", type=common.int_list, default=[4, 1])
    parser.add_argument("--repeats", type=int, default=2, help="timed passes (best is kept)")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--src-len", type=int, default=24, help="tokens incl. EOS")
    parser.add_argument("--out-len", type=int, default=30, help="decoder steps incl. EOS")
    parser.add_argument("--batch", type=int, help="default decode.batch_sentences")
    parser.add_argument("--override", action="append", default=[], help="model.num_layers=2")
    common.add_output_args(parser)
    args = parser.parse_args()
    if args.smoke:
        args.repeats, args.sentences, args.batch, args.src_len, args.out_len = 1, 8, 8, 8, 6
        args.override = [*args.override, "model.num_layers=1"]
    info = common.machine_info()
    common.print_machine(info)
    common.warn_if_busy(info)
    experiment = common.load_experiment(args.config, tuple(args.override))
    config = dataclasses.replace(experiment.model, **MARIAN_OPTIONS)
    batch = args.batch or experiment.decode.batch_sentences
    ids = decode_speed.random_sources(args.sentences, args.src_len, config.vocab_size)
    pieces = np.asarray(_pieces(config.vocab_size))
    sources = [pieces[row[row != PAD_ID]].tolist() for row in ids]
    rows = []
    with tempfile.TemporaryDirectory(prefix="attnmt-ct2-") as folder:
        models = convert(config, Path(folder), args.quantizations)
        for quantization, model_dir in models.items():
            for beam in args.beams:
                rows.append(
                    ct2_forced(
                        model_dir,
                        quantization,
                        sources,
                        beam=beam,
                        batch=batch,
                        out_len=args.out_len,
                        repeats=args.repeats,
                    )
                )
                print(
                    f"  ct2 {quantization} beam={beam}: {rows[-1]['sent_per_s']:.1f} sent/s",
                    file=sys.stderr,
                )
    print(common.markdown_table(rows, decode_speed.COLUMNS))
    common.append_json(args.json, "ctranslate2_speed", args, rows)


if __name__ == "__main__":
    main()
