"""A workdir as training leaves it, with random weights, that the decoding tests translate
with (in process and through the command line)."""

import random

import jax
import numpy as np
import pytest

from attnmt.checkpoint.manager import CheckpointManager
from attnmt.data.tokenizer import train_vocab
from attnmt.model.transformer import Transformer
from attnmt.train.optim import make_optimizer
from attnmt.train.step import create_train_state
from tests.helpers import AWKWARD, WORDS, tiny_experiment


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A workdir as training leaves it: config, vocabulary, one checkpoint (random weights)."""
    root = tmp_path_factory.mktemp("run")
    rng = random.Random(0)
    text = [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))) + rng.choice(AWKWARD) + "x"
        for _ in range(300)
    ]
    train_vocab(text, root / "vocab.model", vocab_size=48)
    experiment = tiny_experiment(
        [
            "--config.model.vocab_size=48",
            "--config.model.d_model=16",
            "--config.model.d_ff=32",
            "--config.model.d_k=8",
            "--config.model.d_v=8",
            "--config.model.num_layers=1",
            "--config.model.max_length=24",
            "--config.data.max_length=16",
            "--config.decode.beam_size=2",
            "--config.decode.max_len_offset=5",
            "--config.decode.batch_sentences=4",
        ]
    )
    example = {"src_tokens": np.ones((1, 8), np.int32), "tgt_tokens": np.ones((1, 8), np.int32)}
    model, optimizer = Transformer(experiment.model), make_optimizer(experiment.optim, 16)
    state = create_train_state(model, optimizer, jax.random.PRNGKey(0), example)
    manager = CheckpointManager(root)
    manager.save(1, state, {"epoch": 0, "index": 0, "seed": 0}, experiment.to_dict())
    manager.close()
    return root, experiment, state.params
