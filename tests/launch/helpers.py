"""Running the launcher scripts as a user would, and reading their dry-run output."""

from __future__ import annotations

import os
import random
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEREDOC_END = "ATTNMT_EOF"
LETTERS = "abcdefgh"


def launch(script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 60):
    """`python launch/<script>.py args...` from the repository root."""
    return subprocess.run(
        [sys.executable, str(REPO / "launch" / f"{script}.py"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        check=False,
    )


def dry_run(script: str, *args: str) -> str:
    result = launch(script, *args, "--dry-run")
    assert result.returncode == 0, result.stderr
    return result.stdout


def shell_commands(script_text: str) -> list[tuple[list[str], str | None]]:
    """(words, here-document) per command of a dry-run; comments and blank lines skipped."""
    commands = []
    lines = iter(script_text.splitlines())
    for line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        stdin = None
        if line.endswith(f"<<'{HEREDOC_END}'"):
            body = []
            for body_line in lines:
                if body_line == HEREDOC_END:
                    break
                body.append(body_line)
            stdin = "\n".join(body) + "\n"
            line = line[: -len(f"<<'{HEREDOC_END}'")]
        commands.append((shlex.split(line), stdin))
    return commands


def train_part(words: list[str]) -> list[str]:
    """The words from `train` to the end of the attnmt arguments (before any redirection)."""
    start = words.index("train")
    end = next((i for i, w in enumerate(words) if w in (">", ">>", "&", "2>&1", "|")), None)
    return words[start:end]


def write_corpus(directory: Path, train: int = 300, dev: int = 16) -> Path:
    """A reversal task: letters in, the same letters reversed out."""
    rng = random.Random(0)
    directory.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", train), ("dev", dev)):
        lines = [[rng.choice(LETTERS) for _ in range(rng.randint(2, 5))] for _ in range(count)]
        (directory / f"{split}.src").write_text("\n".join(" ".join(s) for s in lines) + "\n")
        (directory / f"{split}.tgt").write_text("\n".join(" ".join(s[::-1]) for s in lines) + "\n")
    return directory


def corpus_overrides(corpus: Path) -> list[str]:
    """Overrides for configs/tiny.py on a corpus from write_corpus, kept fast: compiling is
    most of a tiny run, so one bucket shape (max_length 8) and no memory pre-flight (which
    compiles the step once more)."""
    return [
        f"--config.data.src_path={corpus}/{{split}}.src",
        f"--config.data.tgt_path={corpus}/{{split}}.tgt",
        "--config.data.max_length=8",
        "--config.model.vocab_size=32",
        "--config.train.memory_preflight=false",
    ]


# A one-layer width-32 Transformer: any config becomes a model that compiles in seconds.
TINY_MODEL = [
    "--config.model.d_model=32",
    "--config.model.d_ff=64",
    "--config.model.num_heads=2",
    "--config.model.d_k=16",
    "--config.model.d_v=16",
    "--config.model.num_layers=1",
]

# XLA's CPU backend at optimisation level 0 compiles a tiny model about twice as fast; the
# numbers are the same to the precision the tests look at.
FAST_COMPILE_ENV = {"XLA_FLAGS": "--xla_backend_optimization_level=0"}
