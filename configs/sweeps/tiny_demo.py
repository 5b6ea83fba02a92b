"""Three tiny runs for a local end-to-end check of the sweep → train → report path.

    python launch/sweep.py configs/sweeps/tiny_demo.py --root runs/sweeps --launcher local \
        --config.data.src_path='corpus/{split}.src' --config.data.tgt_path='corpus/{split}.tgt'
    attnmt report runs/sweeps/tiny_demo

configs/tiny.py reads any parallel text (its splits are train and dev); give the corpus with
the two overrides above. Ten steps each, evaluated every five, so dev scalars exist.
"""

SHORT = {
    "train.num_steps": 10,
    "train.log_every_steps": 5,
    "train.eval_every_steps": 5,
    "train.checkpoint_every_steps": 10,
    "optim.warmup_steps": 5,
}

RUNS = [
    {"name": "base", "config": "configs/tiny.py", "overrides": dict(SHORT)},
    {"name": "dff128", "config": "configs/tiny.py", "overrides": {**SHORT, "model.d_ff": 128}},
    {"name": "n1", "config": "configs/tiny.py", "overrides": {**SHORT, "model.num_layers": 1}},
]
