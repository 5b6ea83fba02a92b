"""WMT 2014 English→German, the paper's main task (§5.1, Tables 2-3).

    attnmt train --config configs/wmt14_ende.py:variant=base --workdir gs://bucket/ende_base
    attnmt params --config configs/wmt14_ende.py:variant=C4

Arguments: variant = base | big | A1..A4 | B1 | B2 | C1..C7 | D1..D4 | E (Table 3 rows in
the table's order), runlocal = true shrinks everything for a CPU smoke run.
Data: TFDS `wmt14_translate/de-en`; shared BPE vocabulary of 37,000 pieces.
"""

from attnmt.config_defaults import wmt14_config


def get_config(arg: str | None = None):
    return wmt14_config("en-de", arg)
