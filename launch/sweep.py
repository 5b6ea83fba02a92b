"""A sweep: every run of a sweep file, one after another, on any launcher.

    python launch/sweep.py configs/sweeps/table3.py --root /mnt/runs/sweeps \
        --launcher tpu_vm --tpu 'ende-{run}' --zone us-central2-b --dry-run
    python launch/sweep.py configs/sweeps/tiny_demo.py --root runs/sweeps --launcher local \
        --config.data.src_path='corpus/{split}.src' --config.data.tgt_path='corpus/{split}.tgt'

A sweep file defines RUNS, a list of {"name": ..., "config": "file.py[:arg]", "overrides":
{"section.key": value}}. Run <name> trains in <root>/<sweep file's stem>/<name>, so names
and workdirs are the same every time and a repeated sweep resumes its runs. `--config.a.b=v`
given here applies to every run (after the run's own overrides); launcher flags follow the
launcher's script (`python launch/<launcher>.py --help`). Locally the runs go one at a time;
a failed run is reported and the sweep continues with the next.
"""

from __future__ import annotations

import argparse
import posixpath
import runpy
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

if __package__ in (None, ""):  # run as `python launch/sweep.py`: make `launch` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launch import gke, local, slurm, tpu_vm
from launch.common import (
    LaunchError,
    Run,
    add_dry_run_argument,
    add_program_argument,
    check_name,
    execute,
    main_guard,
    require_tool,
    split_overrides,
)

LAUNCHERS: dict[str, ModuleType] = {"local": local, "tpu_vm": tpu_vm, "gke": gke, "slurm": slurm}
RUN_KEYS = {"name", "config", "overrides"}


def load_sweep(path: str | Path) -> list[dict[str, Any]]:
    """RUNS of a sweep file, checked: known keys, a name and a config in each, unique names."""
    try:
        namespace = runpy.run_path(str(path))
    except OSError as error:
        raise LaunchError(f"cannot read sweep file {path}: {error}") from None
    entries = namespace.get("RUNS")
    if not isinstance(entries, list) or not entries:
        raise LaunchError(f"sweep file {path} must define RUNS, a non-empty list of dicts")
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        where = f"{path}: RUNS[{index}]"
        if not isinstance(entry, dict) or not {"name", "config"} <= set(entry):
            raise LaunchError(f"{where} must be a dict with 'name' and 'config'")
        unknown = set(entry) - RUN_KEYS
        if unknown:
            raise LaunchError(f"{where} has unknown keys {sorted(unknown)}; known: {RUN_KEYS}")
        if not isinstance(entry.get("overrides", {}), Mapping):
            raise LaunchError(f"{where}: 'overrides' must be a dict of 'section.key': value")
        name = check_name(str(entry["name"]))
        if name in seen:
            raise LaunchError(f"{where}: run name {name!r} appears twice")
        seen.add(name)
    return entries


def expand(path: str | Path, root: str, overrides: Mapping[str, Any] | None = None) -> list[Run]:
    """The sweep's runs with workdirs <root>/<sweep>/<name>; `overrides` apply to all."""
    sweep = Path(path).stem
    runs = []
    for entry in load_sweep(path):
        merged = {**entry.get("overrides", {}), **(overrides or {})}
        # posixpath, not Path: workdirs are remote paths, not this machine's.
        workdir = posixpath.join(root, sweep, entry["name"])
        runs.append(Run(str(entry["name"]), str(entry["config"]), workdir, merged))
    return runs


def _select(runs: Sequence[Run], only: str | None) -> list[Run]:
    if not only:
        return list(runs)
    wanted = [name.strip() for name in only.split(",") if name.strip()]
    missing = sorted(set(wanted) - {run.name for run in runs})
    if missing:
        raise LaunchError(f"--only names runs the sweep lacks: {', '.join(missing)}")
    return [run for run in runs if run.name in wanted]


def build_parser(launcher: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch/sweep.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("sweep", help="a sweep file, e.g. configs/sweeps/table3.py")
    parser.add_argument("--root", required=True, help="workdirs go to <root>/<sweep>/<run>")
    parser.add_argument("--launcher", choices=sorted(LAUNCHERS), default="local")
    parser.add_argument("--only", default=None, help="comma-separated run names")
    module = LAUNCHERS[launcher]
    add_program_argument(parser, module.DEFAULT_PROGRAM)
    module.add_launcher_arguments(parser)
    add_dry_run_argument(parser)
    return parser


def _main(argv: list[str] | None) -> int:
    rest, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--launcher", choices=sorted(LAUNCHERS), default="local")
    launcher = first.parse_known_args(rest)[0].launcher
    args = build_parser(launcher).parse_args(rest)
    module = LAUNCHERS[launcher]
    runs = _select(expand(args.sweep, args.root, overrides), args.only)
    plans = [(run, module.commands_for_run(run, args)) for run in runs]
    if args.dry_run:
        for run, commands in plans:
            print(f"# {run.name}: {run.workdir}")
            execute(commands, dry_run=True)
        return 0
    if getattr(module, "TOOL", None):
        require_tool(module.TOOL, f"launch runs with the {launcher} launcher")
    failed = []
    for run, commands in plans:
        print(f"launch: {run.name} -> {run.workdir}", file=sys.stderr)
        if execute(commands, dry_run=False):
            failed.append(run.name)
    if failed:
        print(f"launch: failed runs: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    return main_guard(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
