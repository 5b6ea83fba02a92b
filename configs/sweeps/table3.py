"""Table 3 of the paper: the base model, each variant row (A)-(E), and the big model, on
WMT'14 En→De (dev = newstest2013), each for the config's number of steps.

    python launch/sweep.py configs/sweeps/table3.py --root gs://bucket/sweeps \
        --launcher tpu_vm --tpu 'ende-{run}' --zone us-central2-b
    attnmt report gs://bucket/sweeps/table3

Rows are named as in attnmt.config.variants (A1 = one head, ..., C4 = d_model 256, E = learned
positions). Dev BLEU (beam 4, α 0.6, no checkpoint averaging, as for Table 3) is computed
once, at the last step.
"""

VARIANTS = [
    "base",
    *("A1", "A2", "A3", "A4"),
    *("B1", "B2"),
    *("C1", "C2", "C3", "C4", "C5", "C6", "C7"),
    *("D1", "D2", "D3", "D4"),
    "E",
    "big",
]

# The steps of the base config; the big variant sets its own 300k (and so decodes at each
# multiple of 100k).
DEV_BLEU = {"train.bleu_every_steps": 100_000}

RUNS = [
    {"name": name, "config": f"configs/wmt14_ende.py:variant={name}", "overrides": DEV_BLEU}
    for name in VARIANTS
]
