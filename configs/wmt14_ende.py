"""WMT 2014 English→German, the paper's main task (§5.1, Tables 2-3).

    attnmt train --config configs/wmt14_ende.py:variant=base --workdir gs://bucket/ende_base
    attnmt params --config configs/wmt14_ende.py:variant=C4

Arguments: variant = base | big | A1..A4 | B1 | B2 | C1..C7 | D1..D4 | E (Table 3 rows in
the table's order), runlocal = true shrinks everything for a CPU smoke run.
Data: TFDS `wmt14_translate/de-en`; shared BPE vocabulary of 37,000 pieces.
This file holds the recipe for both WMT 2014 pairs; configs/wmt14_enfr.py builds on it.
"""

import ml_collections

from attnmt.config.recipes import apply_variant, base_config, parse_config_arg, shrink_for_cpu

WMT14 = {
    # pair: (TFDS name, target language, vocabulary size, sentencepiece model) — §5.1
    "en-de": ("wmt14_translate/de-en", "de", 37_000, "bpe"),  # shared BPE
    "en-fr": ("wmt14_translate/fr-en", "fr", 32_000, "unigram"),  # word pieces
}


def wmt14_config(pair: str, arg: str | None) -> ml_collections.ConfigDict:
    """WMT 2014 English→German or English→French with the paper's variants (§5.1, Table 3)."""
    args = parse_config_arg(arg, variant="base", runlocal=False)
    name, target, vocab_size, model_type = WMT14[pair]
    config = base_config()
    config.data.source = "tfds"
    config.data.tfds_name = name
    config.data.src_lang = "en"
    config.data.tgt_lang = target
    config.data.train_split = "train"
    config.data.eval_split = "validation"  # newstest2013, the Table 3 dev set
    config.data.test_split = "test"  # newstest2014
    config.model.vocab_size = vocab_size
    config.data.vocab_model_type = model_type
    # The paper's ≈25k-token update at any device count: accumulated when the devices hold
    # fewer than 4,096 tokens per side each at once (8 devices hold it in one step, as the
    # paper's 8 P100s did). Batch sizes in multiples of 16 keep the data order the same on
    # 1 to 16 devices.
    config.data.batch_multiple = 16
    config.train.max_tokens_per_device = 4096
    apply_variant(config, args["variant"], pair)
    if args["runlocal"]:
        shrink_for_cpu(config)  # a CPU: float32 and threefry, the defaults, stay
    else:
        accelerator_defaults(config)
    return config


def accelerator_defaults(config: ml_collections.ConfigDict) -> None:
    """What the recipe runs on a TPU or GPU; `runlocal=true` (a CPU) keeps the defaults.

    bfloat16 compute (parameters stay float32): the time and cost of docs/REPRODUCING.md
    are computed from dense bfloat16 peaks (v4 275, H100 989 TFLOP/s per chip), which
    float32 matmuls do not reach. Speed-up unmeasured here: BENCHMARKS.md §6 (bench/gpu.py)
    has not yet been run on a GPU; on the CPU of BENCHMARKS.md bfloat16 is slow (no
    bfloat16 instructions), hence float32 for runlocal.
    rbg dropout masks (XLA's RngBitGenerator, train/step.py): unmeasured on accelerators
    here; on that CPU no gain was measured (Multi30K: 1,148 and 1,158 target tokens/s
    against 1,177 with threefry, BENCHMARKS.md's table of changes). Cost: resume stays
    bit-exact on the same mesh, but resuming on another device count may draw other masks
    (README, "Resume on another device count"); --config.train.dropout_rng=threefry keeps
    the masks the same on every mesh.
    """
    config.model.dtype = "bfloat16"
    config.train.dropout_rng = "rbg"


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return wmt14_config("en-de", arg)
