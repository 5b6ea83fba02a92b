"""A SLURM batch script for multi-node GPU training, submitted with `sbatch` (on stdin).

    python launch/slurm.py --nodes 2 --gpus-per-node 8 --partition gpu --time 24:00:00 \
        --setup 'source ~/attnmt-venv/bin/activate' \
        --config configs/wmt14_ende.py:variant=big --workdir /shared/runs/ende_big

The environment --setup activates must be on storage every node sees, with Python 3.11 and
the tested CUDA set, made once from a checkout (pip install uv first):

    uv venv --python 3.11 ~/attnmt-venv
    uv pip install --python ~/attnmt-venv/bin/python --constraint constraints/cuda12.txt \
        -e '.[tfds,gcs]' 'jax[cuda12]'

(gcs only for a gs:// workdir; the launcher warns when one is used.)

`srun` starts one attnmt process per GPU (default) and JAX joins them from the SLURM_*
variables, each process taking the GPU of its SLURM_LOCALID. `--tasks node` starts one per
node instead, but JAX's SLURM detection then still pins every process to GPU 0
(local_device_ids = [SLURM_LOCALID]), so it needs explicit local devices in attnmt first.
SLURM sends SIGTERM --grace-seconds before the time limit; the run checkpoints and exits
with 143, which `--requeue` turns into a requeued job that resumes. The workdir must be on a
filesystem every node sees.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python launch/slurm.py`: make `launch` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launch.common import (
    Command,
    Run,
    command,
    parse_env,
    single_run_main,
    url_scheme,
)

TOOL = "sbatch"
DEFAULT_PROGRAM = "attnmt"
SIGTERM_EXIT = 143  # what attnmt train returns after checkpointing on SIGTERM


def _directives(run: Run, options: argparse.Namespace) -> list[str]:
    tasks_per_node = options.gpus_per_node if options.tasks == "gpu" else 1
    values: list[tuple[str, object]] = [
        ("job-name", run.name),
        ("nodes", options.nodes),
        ("ntasks-per-node", tasks_per_node),
        ("gpus-per-node", options.gpus_per_node),
        ("time", options.time),
        ("output", f"{options.log_dir}/%x-%j.out"),
        ("signal", f"TERM@{options.grace_seconds}"),
        ("open-mode", "append"),  # a requeued job keeps adding to the same log
    ]
    optional = {
        "partition": options.partition,
        "account": options.account,
        "cpus-per-task": options.cpus_per_task,
        "mem": options.mem,
    }
    values += [(key, value) for key, value in optional.items() if value]
    lines = [f"#SBATCH --{key}={value}" for key, value in values]
    if options.requeue:
        lines.append("#SBATCH --requeue")
    return lines


def batch_script(run: Run, options: argparse.Namespace) -> str:
    """The sbatch script: directives, setup lines, exports, srun, optional requeue."""
    train = shlex.join(run.train_argv(shlex.split(options.program)))
    body = [
        "#!/bin/bash",
        *_directives(run, options),
        "",
        "set -uo pipefail",
        *options.setup,
        *(f"export {k}={shlex.quote(v)}" for k, v in parse_env(options.env).items()),
        f"srun --kill-on-bad-exit=1 {train}",
        "status=$?",
    ]
    if options.requeue:
        body += [
            f'if [ "$status" -eq {SIGTERM_EXIT} ]; then',
            '  scontrol requeue "$SLURM_JOB_ID"',
            "fi",
        ]
    body.append('exit "$status"')
    return "\n".join(body) + "\n"


def commands_for_run(run: Run, options: argparse.Namespace) -> list[Command]:
    if options.tasks == "node" and options.gpus_per_node > 1:
        print(
            "launch: warning: --tasks node: JAX's SLURM detection pins each process to one GPU "
            "(local_device_ids=[SLURM_LOCALID]); use --tasks gpu unless attnmt sets them",
            file=sys.stderr,
        )
    if url_scheme(run.workdir) == "gs":
        print(
            "launch: note: a gs:// workdir needs attnmt's gcs extra in the nodes' environment "
            "(pip install '.[gcs]'), or attnmt stops with 'needs the gcsfs package'",
            file=sys.stderr,
        )
    # SLURM does not create the directory of --output; the job would fail to start.
    return [
        command("mkdir", "-p", options.log_dir),
        command("sbatch", stdin=batch_script(run, options)),
    ]


def add_launcher_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument(
        "--tasks", choices=["gpu", "node"], default="gpu", help="one process per GPU or per node"
    )
    parser.add_argument("--time", default="24:00:00", help="time limit, [D-]HH:MM:SS")
    parser.add_argument("--partition", default=None)
    parser.add_argument("--account", default=None)
    parser.add_argument("--cpus-per-task", type=int, default=None)
    parser.add_argument("--mem", default=None, help="memory per node, e.g. 0 (all) or 500G")
    parser.add_argument("--log-dir", default="slurm-logs", help="where %%x-%%j.out goes")
    parser.add_argument("--grace-seconds", type=int, default=120, help="SIGTERM before limit")
    parser.add_argument("--requeue", action="store_true", help="requeue after a SIGTERM stop")
    parser.add_argument(
        "--setup", action="append", default=[], help="shell line run first (venv, modules)"
    )
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE to export")


def main(argv: list[str] | None = None) -> int:
    return single_run_main(
        argv,
        prog="launch/slurm.py",
        description=__doc__,
        add_launcher_arguments=add_launcher_arguments,
        commands_for_run=commands_for_run,
        tool=TOOL,
        purpose="submit the batch job",
        program=DEFAULT_PROGRAM,
    )


if __name__ == "__main__":
    sys.exit(main())
