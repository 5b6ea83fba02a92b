"""Sample efficiency of the quick Multi30K run: the same number of updates, one lever each.

    taskset -c 0 python launch/sweep.py configs/sweeps/m30k_quick_steps.py --root runs/sweeps \
        --launcher local
    attnmt report runs/sweeps/m30k_quick_steps

Each run is `configs/multi30k.py:quick=true` stopped after a fixed number of updates (not
minutes), so the comparison does not depend on what else shares the CPU; validation loss
every 250 updates. Levers that change the cost of an update (tokens per batch, model shape)
are compared at equal target tokens, and their step time is measured separately
(docs/REPRODUCING.md, "Tuning the quick run").
"""

STEPS = 500
BASE = {
    # The quick run as it was when this sweep was measured (length buckets, the paper's
    # learning rate); "packed" and "lr05" are what it has now.
    "data.pack_length": 0,
    "optim.learning_rate_scale": 1.0,
    "train.num_steps": STEPS,
    "train.time_limit_minutes": 0.0,
    "train.eval_every_steps": 250,
    "train.checkpoint_every_steps": 250,
}
QUICK = "configs/multi30k.py:quick=true"


def run(name: str, **overrides) -> dict:
    return {"name": name, "config": QUICK, "overrides": {**BASE, **overrides}}


RUNS = [
    run("base"),
    run("lr2", **{"optim.learning_rate_scale": 2.0}),
    run("lr05", **{"optim.learning_rate_scale": 0.5}),
    run("lr03", **{"optim.learning_rate_scale": 0.3}),
    run("packed", **{"data.pack_length": 64}),
    run("nodrop", **{"model.dropout_rate": 0.0, "model.attention_dropout_rate": 0.0}),
    run(
        "tok1024",
        **{
            "data.tokens_per_batch": 1024,
            "train.num_steps": 2 * STEPS,
            "train.eval_every_steps": 500,
            "train.checkpoint_every_steps": 500,
            "optim.warmup_steps": 500,
        },
    ),
    run("warm100", **{"optim.warmup_steps": 100}),
    run("ls0", **{"train.label_smoothing": 0.0}),
]
