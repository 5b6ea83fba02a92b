"""Fine-tune a model brought in by `attnmt import` (e.g. a Hugging Face opus-mt checkpoint):
the imported workdir's own config, with a fine-tuning schedule, on your parallel files.

    attnmt import opus-mt-en-de --workdir runs/opus_ende
    attnmt train --config configs/finetune.py:workdir=runs/opus_ende --workdir runs/opus_ende \
        --config.data.src_path='corpus/{split}.{src}' --config.data.tgt_path='corpus/{split}.{tgt}'

Training starts from the imported parameters with a fresh optimizer; once it has written a
checkpoint, the same command resumes as usual. The model section is the imported one and
must stay so (the checkpoint's shapes are checked).
"""

import json
from pathlib import Path

import ml_collections

from attnmt.config.recipes import parse_config_arg
from attnmt.errors import ConfigError


def get_config(arg: str | None = None):
    args = parse_config_arg(arg, workdir="", steps=2000, warmup=500, lr_scale=0.05)
    path = Path(args["workdir"]) / "config.json"
    if not args["workdir"] or not path.is_file():
        raise ConfigError(
            "configs/finetune.py needs :workdir=W, a workdir written by `attnmt import` "
            f"(no {path})"
        )
    config = ml_collections.ConfigDict(json.loads(path.read_text(encoding="utf-8")))
    config.train.num_steps = args["steps"]
    # A peak learning rate of about 1e-4 at d_model 512 (the paper's formula × lr_scale):
    # an order below training from scratch, so the imported model is adapted, not erased.
    config.optim.warmup_steps = args["warmup"]
    config.optim.learning_rate_scale = args["lr_scale"]
    config.train.checkpoint_every_steps = 500
    return config
