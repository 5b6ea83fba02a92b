"""What many test files build alike: tiny model configs, tiny corpora (the letter-reversal
task, a synthetic English-German corpus, the interop word-for-word task), the arguments and
overrides of a tiny `attnmt train` run, small checkpoint states, the attention figures'
file names and an independent tree check. Test modules import from here (or from the
helper modules beside them), never from each other or from a conftest.py."""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attnmt.config import Experiment, load_experiment
from attnmt.config.model import ModelConfig

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
TINY_CONFIG = CONFIGS / "tiny.py"

# ---- tiny models ------------------------------------------------------------------------

# The tiny literal most tests used; each caller passes what its own model differs in.
_TINY_MODEL: dict[str, Any] = {
    "vocab_size": 24,
    "d_model": 16,
    "d_ff": 32,
    "num_heads": 2,
    "d_k": 8,
    "d_v": 8,
    "num_layers": 2,
    "dropout_rate": 0.0,
}


def tiny_model(**changes: Any) -> ModelConfig:
    """A two-layer width-16 Transformer without dropout, with `changes` applied."""
    return ModelConfig(**{**_TINY_MODEL, **changes})


def random_params(config: ModelConfig, seed: int) -> Any:
    """Freshly initialised (untrained) parameters of a Transformer with `config`."""
    import flax.linen as nn

    from attnmt.model.transformer import Transformer

    tokens = jnp.ones((1, 8), jnp.int32)
    init = jax.jit(Transformer(config).init)  # one compile, not one per operation
    return nn.meta.unbox(init(jax.random.PRNGKey(seed), tokens, tokens)["params"])


# A one-layer width-32 Transformer: any config becomes a model that compiles in seconds.
TINY_MODEL_OVERRIDES = [
    "--config.model.d_model=32",
    "--config.model.d_ff=64",
    "--config.model.num_heads=2",
    "--config.model.d_k=16",
    "--config.model.d_v=16",
    "--config.model.num_layers=1",
]

# ---- tiny corpora -----------------------------------------------------------------------

LETTERS = "abcdefgh"


def reversal_text(rng: random.Random, count: int) -> tuple[str, str]:
    """`count` lines of 2-5 letters, and the same lines reversed (the target side)."""
    lines = [[rng.choice(LETTERS) for _ in range(rng.randint(2, 5))] for _ in range(count)]
    src = "".join(" ".join(s) + "\n" for s in lines)
    return src, "".join(" ".join(s[::-1]) + "\n" for s in lines)


def write_reversal_corpus(directory: Path, train: int = 1500, dev: int = 64) -> Path:
    """train.{src,tgt} and dev.{src,tgt} of the reversal task (a split of 0 pairs is not
    written), drawn from one Random(0) in that order."""
    rng = random.Random(0)
    directory.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", train), ("dev", dev)):
        if count:
            src, tgt = reversal_text(rng, count)
            (directory / f"{split}.src").write_text(src)
            (directory / f"{split}.tgt").write_text(tgt)
    return directory


# A tiny translation vocabulary's words (tests/decode/conftest.py).
WORDS = "the a dog cat runs sits on mat red blue big small house tree".split()  # noqa: SIM905
# Characters that end a line for some reader (str.splitlines, universal newlines) or that
# text tools often mishandle; NEL (U+0085) even survives sentencepiece's normalisation, so
# the test vocabulary holds a piece with it and the model can emit it.
AWKWARD = ["\x00", "\r", "\n", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029", "\ufeff"]


# A small synthetic English-German corpus (tests/data).
def _words(text: str) -> list[str]:
    return text.split()


EN_WORDS = _words("a man woman dog cat runs sits on the red blue big small street park ball")
DE_WORDS = _words("ein mann frau hund katze läuft sitzt auf der rote blaue große kleine straße")


def make_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """Deterministic pseudo-sentences; words are single-spaced so text survives normalisation."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        k = rng.randint(1, 12)
        en = " ".join(rng.choice(EN_WORDS) for _ in range(k))
        de = " ".join(rng.choice(DE_WORDS) for _ in range(k + rng.randint(-1, 2) or 1))
        pairs.append((en, de))
    return pairs


def interleave(pairs: list[tuple[str, str]]) -> list[str]:
    """The sentences of `pairs`, source then target, pair by pair."""
    return [s for pair in pairs for s in pair]


def shared_data_dir() -> Path:
    """Where the real (shared) data lives: $ATTNMT_DATA_DIR or <repo>/../shared/data."""
    return Path(os.environ.get("ATTNMT_DATA_DIR", REPO.parent / "shared" / "data"))


# ---- tiny runs --------------------------------------------------------------------------


def corpus_paths(corpus: Path | str) -> list[str]:
    """The data overrides that read `{split}.src` / `{split}.tgt` from `corpus`."""
    return [
        f"--config.data.src_path={corpus}/{{split}}.src",
        f"--config.data.tgt_path={corpus}/{{split}}.tgt",
    ]


def tiny_train_args(workdir: Path | str, corpus: Path | str, steps: int, *extra: str) -> list[str]:
    """`train` arguments for the one-layer configs/tiny.py model on a reversal corpus: one
    bucket shape of 16 rows × 8 tokens per update (one compiled train step)."""
    return [
        "train",
        "--config",
        str(TINY_CONFIG),
        "--workdir",
        str(workdir),
        *corpus_paths(corpus),
        "--config.data.max_length=8",
        "--config.data.tokens_per_batch=128",
        "--config.model.vocab_size=32",
        "--config.model.num_layers=1",  # compiles faster; nothing tested depends on depth
        f"--config.train.num_steps={steps}",
        *extra,
    ]


def corpus_overrides(corpus: Path) -> list[str]:
    """Overrides for configs/tiny.py on a reversal corpus, kept fast: compiling is most of
    a tiny run, so one bucket shape (max_length 8) and no memory pre-flight (which compiles
    the step once more)."""
    return [
        *corpus_paths(corpus),
        "--config.data.max_length=8",
        "--config.model.vocab_size=32",
        "--config.train.memory_preflight=false",
    ]


def reversal_overrides(corpus: Path, steps: int) -> list[str]:
    """The in-process training runs' overrides: configs/tiny.py (two layers) learning the
    reversal task of write_reversal_corpus."""
    return [
        *corpus_paths(corpus),
        "--config.data.max_length=16",
        "--config.model.vocab_size=32",
        f"--config.train.num_steps={steps}",
        "--config.train.eval_every_steps=1000",
        "--config.train.checkpoint_every_steps=60",
        "--config.optim.warmup_steps=40",
        "--config.optim.learning_rate_scale=0.5",
    ]


def tiny_experiment(overrides: Sequence[str]) -> Experiment:
    """configs/tiny.py with `overrides` (`--config.a.b=v` items)."""
    return load_experiment(str(TINY_CONFIG), overrides)


# ---- a word-for-word task (tests/interop) ----------------------------------------------

# A word-for-word "translation" task the tiny reference MarianMTModel learns in a few
# hundred updates (tests/interop/conftest.py).
EN = "a man woman dog cat is are runs sits on the in blue red green street park ball".split()  # noqa: SIM905
DE = [
    "ein",
    "mann",
    "frau",
    "hund",
    "katze",
    "ist",
    "sind",
    "läuft",
    "sitzt",
    "auf",
    "der",
    "im",
    "blauen",
    "roten",
    "grünen",
    "straße",
    "park",
    "ball",
]
DICTIONARY = dict(zip(EN, DE, strict=True))


def sentences(words: list[str], n: int, seed: int) -> list[str]:
    """`n` sentences of 2-9 of `words`, each ending " ."."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(2, 9))) + " ." for _ in range(n)]


def translation(sentence: str) -> str:
    """The task's reference translation: each word looked up in DICTIONARY."""
    return " ".join(DICTIONARY.get(word, word) for word in sentence.split())


def word_task_overrides(corpus: Path, steps: int) -> list[str]:
    """configs/tiny.py on a {split}.en / {split}.de corpus: one compiled shape of 24 tokens,
    `steps` updates and one checkpoint at the end, no test split, a fast compile."""
    return [
        f"--config.data.src_path={corpus}/{{split}}.{{src}}",
        f"--config.data.tgt_path={corpus}/{{split}}.{{tgt}}",
        "--config.data.src_lang=en",
        "--config.data.tgt_lang=de",
        "--config.data.max_length=24",
        "--config.data.min_bucket_length=24",  # one compiled shape
        "--config.data.test_split=",
        f"--config.train.num_steps={steps}",
        "--config.train.eval_every_steps=0",
        f"--config.train.checkpoint_every_steps={steps}",
        "--config.train.memory_preflight=false",
        "--config.train.xla_backend_optimization_level=0",
        "--config.optim.warmup_steps=30",
        "--config.optim.learning_rate_scale=1.0",
    ]


def write_word_task_corpus(folder: Path, splits: Mapping[str, list[str]]) -> Path:
    """{split}.en holding each split's sentences and {split}.de their translations."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, lines in splits.items():
        (folder / f"{split}.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
        translated = "\n".join(map(translation, lines)) + "\n"
        (folder / f"{split}.de").write_text(translated, encoding="utf-8")
    return folder


# float32 through 2+2 layers of width 32 (d_ff 64): rounding errors of mixed sign grow like
# √n·u per dot product of n terms (u = 2^-24; Higham §2.8), and each logit ends a chain of
# about 40 of them (10 sublayers of about 4 matmul stages, each followed by a LayerNorm that
# keeps activations at unit scale), so each implementation is within about
# √40·√64·u ≈ 3e-6 of exact, relative to logits of size ≤ 10: 3e-5, twice that for the
# difference of two. 1e-4 leaves room and still catches any wrong weight, layout or option
# (those move logits by 1e-2 or more). Measured: 5e-6 to 6e-6.
LOGIT_ATOL = 1e-4

SOURCES = sentences(EN, 12, seed=7)  # what the interop tests translate and score


def translate_cli(workdir: Path, folder: Path, *flags: str) -> list[str]:
    """`attnmt translate` of SOURCES (XLA level 0: a shorter compile, the same math)."""
    from attnmt.cli.main import main

    source, target = folder / "in.txt", folder / "out.txt"
    source.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    args = ["translate", "--workdir", str(workdir), "--input", str(source), "--xla-opt-level"]
    assert main([*args, "0", "--output", str(target), *flags]) == 0
    return target.read_text(encoding="utf-8").splitlines()


# Lines for the decoding commands: an empty one and a repeated word pair included.
DECODE_LINES = "the dog runs\na red house\n\ncat\nbig small big small\n"


def translate_lines(workdir: Path, folder: Path, name: str, *flags: str) -> list[str]:
    """`attnmt translate` of DECODE_LINES into `<folder>/<name>.txt`, read back split at
    "\n" only (a sample may hold U+2028 and the like: the vocabulary has them)."""
    from attnmt.cli.main import main

    source, target = folder / "input.txt", folder / f"{name}.txt"
    source.write_text(DECODE_LINES)
    args = ["translate", "--workdir", str(workdir), "--input", str(source)]
    assert main([*args, "--output", str(target), *flags]) == 0
    return target.read_text(encoding="utf-8").split("\n")[:-1]


# ---- small checkpoint states ------------------------------------------------------------


def state_at(step: int) -> dict:
    """A small train state whose every value says which step saved it."""
    return {
        "params": {"w": jnp.full((16, 8), step, jnp.float32), "b": jnp.arange(8) + step},
        "step": jnp.asarray(step, jnp.int32),
    }


def data_at(step: int) -> dict:
    return {"epoch": step // 3, "index": step % 3, "seed": 7}


ABSTRACT = jax.eval_shape(lambda: state_at(0))


def assert_is_step(restored: tuple, step: int) -> None:
    """`restored` (step, state, data, config) is what `step` saved, with every value."""
    got_step, state, data, config = restored
    assert got_step == step
    want_leaves = jax.tree_util.tree_leaves(state_at(step))
    for got, want in zip(jax.tree_util.tree_leaves(state), want_leaves, strict=True):
        assert np.array_equal(got, want)
    assert data == data_at(step)
    assert config == {"written_at": step}


# ---- attention figures ----------------------------------------------------------------


def expected_kind_files(kind: str, layers, heads, query: int) -> set[str]:
    """The figure files `attnmt attention` writes for one attention kind (1-based numbers)."""
    names = {f"{kind}_model.png"}
    for layer in layers:
        names |= {f"{kind}_layer{layer}.png", f"{kind}_layer{layer}_query{query}.png"}
        names |= {f"{kind}_layer{layer}_head{head}.png" for head in heads}
    return names


# ---- trees ------------------------------------------------------------------------------


def tree_leaves(tokens: tuple[str, ...], closers: frozenset[str] | None = None) -> int | None:
    """Independent check: the number of leaves of `tokens` if they are one tree (one root,
    balanced brackets, every constituent non-empty, leaves only inside the root), else None.
    A closing bracket must carry its constituent's label; one whose label has no closing
    piece (not in `closers`; None: every label has one) may be closed by any of them."""
    stack: list[tuple[str, int]] = []  # (label, children so far)
    closed_root = False
    count = 0
    for token in tokens:
        if closed_root:
            return None
        if token.startswith("("):
            if stack:
                stack[-1] = (stack[-1][0], stack[-1][1] + 1)
            elif count:
                return None
            stack.append((token[1:], 0))
        elif token.startswith(")"):
            if not stack or stack[-1][1] == 0:
                return None
            label = stack[-1][0]
            if token[1:] != label and (closers is None or label in closers):
                return None
            stack.pop()
            closed_root = not stack
        else:
            if not stack:
                return None
            stack[-1] = (stack[-1][0], stack[-1][1] + 1)
            count += 1
    return count if closed_root else None


def is_tree(tokens: tuple[str, ...], leaves: int) -> bool:
    """One tree, labels matched, with exactly `leaves` leaves."""
    return tree_leaves(tokens) == leaves


# ---- the token cache's debug records (attnmt.data.token_cache, ATTNMT_TOKEN_CACHE_DEBUG) --


def token_cache_writes(debug: Path) -> list[tuple[int, int]]:
    """(shard, writing process) of every shard write recorded in `debug`, in order."""
    log = debug / "writes.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [tuple(map(int, line.split())) for line in lines]


def token_cache_gathers(debug: Path, process: int) -> list[list[int]]:
    """The example ids of every gather process `process` made, in order."""
    import json

    log = debug / f"gathered-{process}.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


# ---- packing (attnmt.data.packing) ------------------------------------------------------


def reference_pack(
    src, tgt, order, rows: int, length: int, source_length: int | None = None
) -> list[tuple[list, list]]:
    """[(ids, rows)]: each example to the first row of the open batch with room on both
    sides (`source_length`, None: `length`, source tokens and `length` target tokens); a
    new batch when none has (examples longer than a row on either side left out)."""
    batches, ids, placed = [], [], []
    capacity = np.array([length if source_length is None else source_length, length])
    free = np.tile(capacity, (rows, 1))
    for example in order:
        size = (src[example], tgt[example])
        if np.any(np.asarray(size) > capacity):
            continue
        room = np.flatnonzero((free >= size).all(axis=1))
        if len(room) == 0:
            batches.append((ids, placed))
            ids, placed, free[:] = [], [], capacity
            room = [0]
        free[room[0]] -= size
        ids.append(example)
        placed.append(room[0])
    if ids:
        batches.append((ids, placed))
    return batches


# ---- a run whose validation curve turns (train.keep_best_by) ------------------------------


def write_turning_corpus(directory: Path) -> Path:
    """The reversal corpus whose dev targets are shifted by one letter (a→b, …, h→a): the
    validation loss falls while the model learns what any target looks like (letters,
    lengths, the end), then rises as it grows sure of the true letter."""
    corpus = write_reversal_corpus(directory, train=1500, dev=64)
    shift = str.maketrans("abcdefgh", "bcdefgha")
    (corpus / "dev.tgt").write_text((corpus / "dev.tgt").read_text().translate(shift))
    return corpus


def event_scalars(folder: Path, tag: str) -> dict[int, float]:
    """step -> value of `tag` in the folder's TensorBoard event files, read record by record
    (u64 length, u32 crc, payload, u32 crc) with tensorboardX's protobuf."""
    import struct

    from tensorboardX.proto import event_pb2

    values: dict[int, float] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                if value.tag == tag:
                    values[event.step] = value.simple_value
    return values
