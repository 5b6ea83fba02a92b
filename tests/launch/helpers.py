"""Running the launcher scripts as a user would, and reading their dry-run output."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEREDOC_END = "ATTNMT_EOF"


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


# XLA's CPU backend at optimisation level 0 compiles a tiny model about twice as fast; the
# numbers are the same to the precision the tests look at.
FAST_COMPILE_ENV = {"XLA_FLAGS": "--xla_backend_optimization_level=0"}
