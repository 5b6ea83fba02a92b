"""WMT 2014 English→French, the paper's second task (§5.1, Table 2).

    attnmt train --config configs/wmt14_enfr.py:variant=base --workdir gs://bucket/enfr_base
    attnmt params --config configs/wmt14_enfr.py:variant=C4

Arguments: variant = base | big | A1..A4 | B1 | B2 | C1..C7 | D1..D4 | E (Table 3 rows in
the table's order), runlocal = true shrinks everything for a CPU smoke run.
"""

from attnmt.config_defaults import apply_variant, base_config, parse_config_arg, shrink_for_cpu


def get_config(arg: str | None = None):
    args = parse_config_arg(arg, variant="base", runlocal=False)
    config = base_config()
    config.data.source = "tfds"
    config.data.tfds_name = "wmt14_translate/fr-en"
    config.data.src_lang = "en"
    config.data.tgt_lang = "fr"
    config.data.train_split = "train"
    config.data.eval_split = "validation"  # newstest2013, the Table 3 dev set
    config.data.test_split = "test"  # newstest2014
    config.model.vocab_size = 32_000  # §5.1 word-piece vocabulary
    config.data.vocab_model_type = "unigram"  # word pieces
    apply_variant(config, args["variant"], "en-fr")
    if args["runlocal"]:
        shrink_for_cpu(config)
    return config
