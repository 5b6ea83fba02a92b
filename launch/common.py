"""What every launcher shares: a run, its `attnmt train` command line, and running commands.

A launcher turns a `Run` into a list of `Command`s. `--dry-run` prints them as a shell
script (what would run, exactly, byte for byte the same argv); otherwise `execute` runs them
in order with subprocess. Background commands (the local launcher's processes) start
together and are waited for as a group, stopping the others as soon as one fails.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from attnmt.config.overrides import OVERRIDE_PREFIX
from attnmt.config.overrides import split_overrides as _split_overrides
from attnmt.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[1]
HEREDOC_END = "ATTNMT_EOF"
# Seconds the other processes of a group get to checkpoint and exit after one has failed.
STOP_GRACE_SECONDS = 30.0


# Object stores a workdir may name directly (attnmt reads and writes them via etils.epath).
REMOTE_SCHEMES = ("gs", "s3")


class LaunchError(Exception):
    """A mistake in the launcher's arguments or a missing tool; printed without traceback."""


def format_value(value: Any) -> str:
    """A Python value as attnmt's command line reads it (booleans as true/false)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def split_overrides(argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Separates `--config.a.b=v` (or `--config.a.b v`) from the launcher's own flags, read
    as attnmt itself reads them (attnmt.config.overrides)."""
    try:
        return _split_overrides(argv)
    except ConfigError as error:
        raise LaunchError(str(error)) from None


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run: a config file (with its `:arg`), a workdir and dotted overrides."""

    name: str
    config: str
    workdir: str
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        # Refused here, before any machine is paid for: attnmt would refuse it on the pod.
        scheme = url_scheme(self.workdir)
        if scheme is not None and scheme not in REMOTE_SCHEMES:
            raise LaunchError(
                f"workdir {self.workdir!r}: {scheme}:// is not a storage attnmt writes to; use "
                "a gs:// bucket path, or a filesystem path that every host mounts"
            )

    def train_argv(self, program: Sequence[str]) -> list[str]:
        """`<program> train --config C --workdir W --config.a.b=v ...` as an argv list."""
        argv = [*program, "train", "--config", self.config, "--workdir", self.workdir]
        argv += [f"{OVERRIDE_PREFIX}{k}={format_value(v)}" for k, v in self.overrides.items()]
        return argv


def url_scheme(path: str) -> str | None:
    """`gs` for `gs://b/x`; None for a filesystem path."""
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", path)
    return match.group(1).lower() if match else None


def warn_if_uncommitted(what: str) -> None:
    """Installs and images ship `git archive HEAD`: say so when the work tree differs."""
    status = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
    )
    if status.returncode == 0 and status.stdout.strip():
        print(f"launch: warning: uncommitted changes are not in {what} (HEAD is)", file=sys.stderr)


def slug(text: str, max_length: int = 40) -> str:
    """A lowercase DNS-style name (GKE, Cloud TPU and SLURM accept it): [a-z0-9-]."""
    cleaned = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    cleaned = cleaned[:max_length].rstrip("-")
    if not cleaned:
        raise LaunchError(f"cannot make a name out of {text!r}")
    return cleaned


def parse_env(items: Sequence[str]) -> dict[str, str]:
    """`--env KEY=VALUE` flags into a dict; a malformed one is refused."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise LaunchError(f"--env expects NAME=VALUE, got {item!r}")
        env[key] = value
    return env


def check_name(name: str) -> str:
    """Run names become file and job names: letters, digits, '.', '_' and '-' only."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise LaunchError(f"run name {name!r} must be letters, digits, '.', '_' or '-'")
    return name


def run_from_args(args: argparse.Namespace, overrides: Mapping[str, str]) -> Run:
    """The `Run` named by --config/--workdir/--name; the name defaults to the workdir's."""
    name = args.name or args.workdir.rstrip("/").rsplit("/", 1)[-1]
    return Run(check_name(name), args.config, args.workdir, dict(overrides))


def add_run_arguments(parser: argparse.ArgumentParser, program: str) -> None:
    """Flags naming one run; `--config.a.b=v` overrides are collected by split_overrides."""
    parser.add_argument("--config", required=True, help="config file[:arg], as for attnmt train")
    parser.add_argument("--workdir", required=True, help="the run's workdir")
    parser.add_argument("--name", default=None, help="run name (default: the workdir's name)")
    add_program_argument(parser, program)


def add_program_argument(parser: argparse.ArgumentParser, program: str) -> None:
    parser.add_argument(
        "--program",
        default=program,
        help=f"how to invoke attnmt where the run executes (default: {program!r})",
    )


def add_dry_run_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dry-run", action="store_true", help="print the commands instead of running them"
    )


@dataclasses.dataclass(frozen=True)
class Command:
    """One command: argv, extra environment, text fed on stdin, a log file, background."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    stdin: str | None = None
    log: str | None = None
    background: bool = False

    def render(self) -> str:
        """The command as one shell line (plus a here-document when it reads stdin)."""
        parts = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        parts.append(shlex.join(self.argv))
        line = " ".join(parts)
        if self.log is not None:
            line += f" > {shlex.quote(self.log)} 2>&1"
        if self.stdin is not None:
            line += f" <<'{HEREDOC_END}'"
        if self.background:
            line += " &"
        if self.stdin is not None:
            body = self.stdin if self.stdin.endswith("\n") else self.stdin + "\n"
            line += f"\n{body}{HEREDOC_END}"
        return line


def command(*argv: str, **kwargs: Any) -> Command:
    return Command(tuple(argv), **kwargs)


def render_script(commands: Sequence[Command]) -> str:
    """Shell text for `commands`, with a `wait` after each group of background commands."""
    lines: list[str] = []
    waiting = False
    for item in commands:
        if waiting and not item.background:
            lines.append("wait")
            waiting = False
        lines.append(item.render())
        waiting = waiting or item.background
    if waiting:
        lines.append("wait")
    return "\n".join(lines) + "\n"


def require_tool(name: str, purpose: str) -> None:
    """Refuses to run (dry-run still works) when a cloud/cluster CLI is not installed."""
    if shutil.which(name) is None:
        raise LaunchError(
            f"{name!r} is not installed or not on PATH; it is needed to {purpose}. "
            "Use --dry-run to print the commands instead."
        )


def execute(commands: Sequence[Command], dry_run: bool, out: TextIO | None = None) -> int:
    """Prints (dry run) or runs `commands` in order; returns the first non-zero exit code.

    Ctrl-C or a SIGTERM to the launcher stops the running group too (130 / 143).
    """
    if dry_run:
        (out or sys.stdout).write(render_script(commands))
        return 0
    group: list[tuple[Command, subprocess.Popen]] = []
    previous = signal.signal(signal.SIGTERM, _raise_sigterm)
    try:
        for item in commands:
            if item.background:
                group.append((item, _start(item)))
                continue
            code, group = wait_for_group(group), []
            if code:
                return code
            code = _run_foreground(item)
            if code:
                print(
                    f"launch: `{shlex.join(item.argv)[:200]}` exited with {code}", file=sys.stderr
                )
                return code
        return wait_for_group(group)
    except KeyboardInterrupt:
        _stop(group)
        return 130
    except _SigtermError:
        _stop(group)
        return 143
    finally:
        signal.signal(signal.SIGTERM, previous)


def _environment(item: Command) -> dict[str, str]:
    return {**os.environ, **item.env}


def _exit_code(returncode: int) -> int:
    """A process killed by signal N (returncode -N) reports 128 + N, as a shell would."""
    return returncode if returncode >= 0 else 128 - returncode


@contextlib.contextmanager
def _output(item: Command) -> Iterator[dict[str, Any]]:
    """stdout and stderr into the command's log when it has one, else into ours."""
    if item.log is None:
        yield {}
        return
    # The child gets its own copy of the descriptor, so ours can close once it has started.
    with open(item.log, "ab") as log:
        yield {"stdout": log, "stderr": subprocess.STDOUT}


def _run_foreground(item: Command) -> int:
    with _output(item) as streams:
        result = subprocess.run(
            list(item.argv),
            input=None if item.stdin is None else item.stdin.encode(),
            env=_environment(item),
            check=False,
            **streams,
        )
    return _exit_code(result.returncode)


def _start(item: Command) -> subprocess.Popen:
    with _output(item) as streams:
        return subprocess.Popen(
            list(item.argv), env=_environment(item), stdin=subprocess.DEVNULL, **streams
        )


class _SigtermError(Exception):
    """The launcher itself got SIGTERM (a scheduler, `kill`): stop the group, then exit."""


def _raise_sigterm(signum: int, frame: Any) -> None:
    raise _SigtermError


def wait_for_group(group: Sequence[tuple[Command, subprocess.Popen]]) -> int:
    """Waits for every process. Once one fails the others are stopped, since their peers
    would otherwise wait forever in a collective. Returns the first failure's code, or 0."""
    while group:
        codes = [process.poll() for _, process in group]  # every one, each time
        for (item, _), code in zip(group, codes, strict=True):
            if code:
                _report_failure(item, code)
                _stop(group)
                return _exit_code(code)
        if all(code is not None for code in codes):
            break
        time.sleep(0.2)
    return 0


def _stop(group: Sequence[tuple[Command, subprocess.Popen]]) -> None:
    """SIGTERM (training checkpoints at the next step), then SIGKILL after the grace time."""
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    _signal_all(group, signal.SIGTERM)
    for _, process in group:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            _signal_all(group, signal.SIGKILL)
            process.wait()


def _report_failure(item: Command, code: int) -> None:
    where = f"; log: {item.log}" if item.log else ""
    print(f"launch: a process exited with {_exit_code(code)}{where}", file=sys.stderr)


def _signal_all(group: Sequence[tuple[Command, subprocess.Popen]], sig: int) -> None:
    for _, process in group:
        if process.poll() is None:
            process.send_signal(sig)


def main_guard(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Runs a launcher's main, printing a LaunchError as one line with exit code 2."""
    try:
        return main(argv)
    except LaunchError as error:
        print(f"launch: error: {error}", file=sys.stderr)
        return 2


def single_run_main(
    argv: list[str] | None,
    *,
    prog: str,
    description: str | None,
    add_launcher_arguments: Callable[[argparse.ArgumentParser], None],
    commands_for_run: Callable[[Run, argparse.Namespace], list[Command]],
    tool: str,
    purpose: str,
    program: str = "attnmt",
) -> int:
    """The command line shared by launchers that submit one run (GKE, SLURM): parse, build
    the commands, then print them (--dry-run) or check the cloud tool and execute them."""

    def inner(inner_argv: list[str] | None) -> int:
        rest, overrides = split_overrides(sys.argv[1:] if inner_argv is None else inner_argv)
        parser = argparse.ArgumentParser(
            prog=prog, description=description, formatter_class=argparse.RawTextHelpFormatter
        )
        add_run_arguments(parser, program)
        add_launcher_arguments(parser)
        add_dry_run_argument(parser)
        args = parser.parse_args(rest)
        commands = commands_for_run(run_from_args(args, overrides), args)
        if not args.dry_run:
            require_tool(tool, purpose)
        return execute(commands, args.dry_run)

    return main_guard(inner, argv)
