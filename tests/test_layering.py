"""Inference never imports training: loading a run, translating, evaluating, averaging and
inspecting attention import no training code (only the train/optim config dataclasses,
which every run's config holds)."""

import json
import subprocess
import sys

INFERENCE_MODULES = [
    "attnmt.workdir",
    "attnmt.decode.translate",
    "attnmt.decode.evaluation",
    "attnmt.decode.beam_search",
    "attnmt.evaluate.bleu",
    "attnmt.checkpoint.manager",
    "attnmt.checkpoint.average",
    "attnmt.model.inspect",
    "attnmt.interop.hf_import",
    "attnmt.interop.hf_export",
]
ALLOWED = {"attnmt.train", "attnmt.train.config"}  # plain dataclasses, no jax


def test_inference_imports_no_training_code():
    probe = (
        "import importlib, json, sys\n"
        f"for name in {INFERENCE_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('attnmt.'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(INFERENCE_MODULES) <= set(loaded)
    training = sorted(m for m in loaded if m.startswith("attnmt.train") and m not in ALLOWED)
    assert training == [], training
