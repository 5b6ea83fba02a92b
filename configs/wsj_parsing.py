"""English constituency parsing as translation (§6.3, Table 4): words → linearized tree.

    attnmt train --config configs/wsj_parsing.py:variant=sample --workdir runs/wsj_sample
    attnmt evaluate --workdir runs/wsj_sample --split dev --ema    # labelled bracket F1
    attnmt parse --workdir runs/wsj_sample < sentences.txt         # one tree per line
    attnmt train --config configs/wsj_parsing.py:variant=paper \\
        --config.data.data_dir=/path/to/treebank/wsj --workdir runs/wsj

Arguments: variant = paper | sample.
- paper: the paper's 4-layer Transformer with d_model 1024 on the WSJ part of the Penn
  Treebank, sections 02-21 train / 22 dev / 23 test (files wsj_0200-2199 / 2200-2299 /
  2300-2399 under data.data_dir, searched recursively), 16K vocabulary.
- sample: a CPU-sized model on NLTK's 179-file WSJ sample (data.data_dir defaults to
  $ATTNMT_PTB_DIR), split by file: wsj_0001-0159 train, wsj_0160-0179 dev; packed rows.
Targets are the trees linearized as in Vinyals et al. (2015), every POS tag written XX
(variant=paper), or with the words themselves as the leaves, which decoding copies from the
input (data.treebank_leaves=words, variant=sample's default: far better on 3,400 trees).
Decoding as in the paper: beam 21, α 0.3, output up to input + 300 tokens (override with
--config.decode.* or the evaluate / parse flags).
"""

import os

from attnmt.config.recipes import base_config, parse_config_arg


def get_config(arg: str | None = None):
    args = parse_config_arg(arg, variant="sample")
    if args["variant"] not in ("paper", "sample"):
        from attnmt.errors import ConfigError

        raise ConfigError(f"variant must be paper or sample, got {args['variant']!r}")
    config = base_config()
    data = config.data
    data.source = "treebank"
    data.src_lang, data.tgt_lang = "words", "tree"
    data.vocab_model_type = "bpe"
    config.decode.beam_size = 21
    config.decode.alpha = 0.3
    config.decode.max_len_offset = 300
    config.train.bleu_every_steps = 0
    if args["variant"] == "paper":
        _paper(config)
    else:
        _sample(config)
    return config


def _paper(config):
    data, model = config.data, config.model
    data.treebank_splits = "train=200-2199,dev=2200-2299,test=2300-2399"
    data.train_split, data.eval_split, data.test_split = "train", "dev", "test"
    data.max_length = 512  # linearized trees are about 4 tokens per word
    model.vocab_size = 16_000
    model.d_model, model.d_ff, model.num_heads = 1024, 4096, 16
    model.d_k = model.d_v = 64
    model.num_layers = 4
    model.max_length = 1024
    model.dropout_rate = 0.3
    config.train.max_tokens_per_device = 4096


def _sample(config):
    data, model, train = config.data, config.model, config.train
    data.data_dir = os.environ.get("ATTNMT_PTB_DIR", "")
    data.treebank_splits = "train=1-159,dev=160-179"
    data.train_split, data.eval_split, data.test_split = "train", "dev", "dev"
    data.max_length = 256
    # More, cheaper updates (session 14, docs/REPRODUCING.md, one core, dev F1 with beam 4):
    # 1,024 tokens per update as 4 packed rows of 256 (data.batch_multiple), d_ff 512 and
    # warmup 800 (as many tokens as 400 updates of 2,048) gave 44.37 against 42.37 at 30
    # minutes (1,441 updates against 603, run side by side), and 58.17 after 60 minutes
    # (2,962 updates; the former recipe: 52.9 here in session 9, 57.00 in the run).
    data.tokens_per_batch = 1024
    data.batch_multiple = 4
    data.min_bucket_length = 16
    # Tuned on dev (docs/REPRODUCING.md, "Parsing the WSJ sample"), an hour on one core:
    # copying the words into the tree (43.3 F1 bucketed, against 13.6 with XX leaves) and
    # packing rows of 256 tokens (52.9: 1,860 real target tokens per update, not 1,410).
    data.treebank_leaves = "words"
    data.pack_length = 256
    # Source rows of 160 tokens (session 19, docs/REPRODUCING.md "Shorter source rows for the
    # parser"): the sentences are 52 % of their trees' tokens, so rows of 256 on both sides
    # left the encoder half padding. At 160 every training and dev pair still fits, each of
    # the first 10 epochs packs into as many batches as before and nearly all the same ones
    # (0-15 of ≈290 differ, where a row's sources would pass 160), and an update costs
    # less: 60 minutes on one core made 5,439 updates against 4,000 (AMD EPYC with AVX-512,
    # 2026-12-04), dev F1 71.71 against 68.87 (moving average; newest checkpoint 72.13).
    data.pack_source_length = 160
    # Not train.word_leaves_as_one_class: an hour with it gave dev F1 37.86 against 57.00
    # (session 13, docs/REPRODUCING.md): learning which word comes next is what makes the
    # decoder follow its place in the sentence.
    model.vocab_size = 2000
    # Narrower (session 16, docs/REPRODUCING.md "The narrower parser for the hour"): d_model
    # 192, d_ff 384, d_k = d_v = 48 gave 54.88 against 51.35 at 30 minutes side by side
    # (session 15), and 59.02 after 60 minutes on one core (3,018 updates, AVX2-only AMD
    # EPYC, 2026-12-03; dev nll 0.655 at 3,000) against session 14's 58.17 with d_model 256.
    model.d_model, model.d_ff, model.num_heads = 192, 384, 4
    model.d_k = model.d_v = 48
    model.num_layers = 4
    model.max_length = 640  # input + 300 at decoding
    # Less dropout than the paper's 0.3. First 0.2 (session 17, docs/REPRODUCING.md "Less
    # dropout for the parser"): an hour was ≈8 epochs of the sample and the dev loss still
    # fell at its end, so there is less to regularise; dev nll 1.39 / 1.03 / 0.73 at 1,000 / 1,500 /
    # 2,000 updates against 1.63 / 1.10 at 1,000 / 1,500 and 0.75 at 2,500 with 0.3, and
    # dev F1 59.12 after 2,225 updates (a slower VM's hour) against 59.02 after 3,018.
    # Dropout 0.1 since session 21 (docs/REPRODUCING.md "Dropout 0.1 for the parser"): with
    # source rows of 160 an hour is ≈21 epochs and the dev loss still fell at its end, the
    # training loss (with dropout) no lower than the dev loss. Side by side on one core each
    # (AMD EPYC with AVX-512, 2026-12-04): 5,621 updates, dev nll of the average 0.31 against
    # the recipe's 0.34, dev F1 with beam 4 76.59 for the average and 77.49 for the newest
    # checkpoint, against 71.71 / 72.13 with 0.2 (session 19, the same kind of VM); with the
    # recipe's beam 21 the average scores 77.84 (73.91 with 0.2). Dropout 0 overfits within
    # the hour (76.13 / 72.46 with beam 4); train.label_smoothing 0 beside it (5,587
    # updates): 69.73 / 69.81.
    model.dropout_rate = 0.1
    model.attention_dropout_rate = 0.1
    model.norm_position = "pre"  # converges in fewer updates (as configs/multi30k.py)
    # A moving average of the parameters (session 18, docs/REPRODUCING.md "A moving average
    # for the parser"), decoded by `attnmt evaluate --ema`: an hour on one core (3,346
    # updates, AVX2-only AMD EPYC, 2026-12-03), dev F1 66.81 against 65.76 for the newest
    # checkpoint of the same run, dev nll 0.467 against 0.494 at 3,250; with d_model 128
    # (4,529 updates) 65.33 against 65.61, nll 0.466 against 0.484.
    config.optim.ema_decay = 0.998
    config.optim.warmup_steps = 800
    train.num_steps = 8000
    train.time_limit_minutes = 60.0
    train.log_every_steps = 50
    train.eval_every_steps = 250
    train.checkpoint_every_steps = 250
    train.keep_checkpoints = 10
