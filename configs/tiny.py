"""A tiny model for tests and smoke runs on any text: two layers of width 32.

    attnmt train --config configs/tiny.py --config.data.src_path=x.{split}.src \
        --config.data.tgt_path=x.{split}.tgt --workdir /tmp/tiny
"""

from attnmt.config.recipes import base_config, parse_config_arg


def get_config(arg: str | None = None):
    args = parse_config_arg(arg, vocab_size=64)
    config = base_config()
    config.data.source = "files"
    config.data.src_lang = "src"
    config.data.tgt_lang = "tgt"
    config.data.eval_split = "dev"
    config.data.test_split = "test"
    config.data.max_length = 32
    config.data.tokens_per_batch = 512
    config.data.vocab_max_sentences = 10_000
    config.model.vocab_size = args["vocab_size"]
    config.model.d_model = 32
    config.model.d_ff = 64
    config.model.num_heads = 2
    config.model.d_k = 16
    config.model.d_v = 16
    config.model.num_layers = 2
    config.model.dropout_rate = 0.0
    config.model.max_length = 64
    config.optim.warmup_steps = 50
    config.optim.learning_rate_scale = 0.3
    config.train.num_steps = 100
    config.train.log_every_steps = 10
    config.train.eval_every_steps = 50
    config.train.checkpoint_every_steps = 50
    config.train.keep_checkpoints = 5
    return config
