"""WMT 2014 English→French, the paper's second task (§5.1, Table 2).

    attnmt train --config configs/wmt14_enfr.py:variant=big --workdir gs://bucket/enfr_big

Arguments: variant = base | big | A1..E (as in wmt14_ende.py; big uses P_drop 0.1 here),
runlocal = true. Data: TFDS `wmt14_translate/fr-en`; 32,000 word pieces. The recipe is
configs/wmt14_ende.py's, for the other pair.
"""

from pathlib import Path

import ml_collections

from attnmt.config import load_config_module

_WMT14 = load_config_module(Path(__file__).with_name("wmt14_ende.py"))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return _WMT14.wmt14_config("en-fr", arg)
