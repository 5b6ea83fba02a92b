"""WMT 2014 English→French, the paper's second task (§5.1, Table 2).

    attnmt train --config configs/wmt14_enfr.py:variant=big --workdir gs://bucket/enfr_big

Arguments: variant = base | big | A1..E (as in wmt14_ende.py; big uses P_drop 0.1 here),
runlocal = true. Data: TFDS `wmt14_translate/fr-en`; 32,000 word pieces.
"""

from attnmt.config_defaults import wmt14_config


def get_config(arg: str | None = None):
    return wmt14_config("en-fr", arg)
