"""N attnmt processes on this machine, joined into one JAX job over 127.0.0.1 (CPU testing).

    python launch/local.py --processes 2 --devices-per-process 2 \
        --config configs/tiny.py --workdir runs/local2 \
        --config.data.src_path='corpus/{split}.src' --config.data.tgt_path='corpus/{split}.tgt'

Process i gets the explicit coordinator variables (ATTNMT_COORDINATOR_ADDRESS on a free
port, ATTNMT_NUM_PROCESSES, ATTNMT_PROCESS_ID=i) and ATTNMT_LOCAL_DEVICE_COUNT fake CPU
devices; its output goes to <workdir>/logs/process_<i>.log (--log-dir elsewhere, as a gs://
workdir needs). The launcher waits for all and exits with the first failure's code (the
others are stopped, since they would otherwise wait for their peer forever).
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python launch/local.py`: make `launch` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launch.common import (
    Command,
    LaunchError,
    Run,
    add_dry_run_argument,
    add_run_arguments,
    command,
    execute,
    main_guard,
    run_from_args,
    split_overrides,
    url_scheme,
)

DEFAULT_PROGRAM = shlex.join([sys.executable, "-m", "attnmt.cli.main"])
# The fake-device count must come from ATTNMT_LOCAL_DEVICE_COUNT alone; an inherited XLA flag
# (the test suite sets one) would contradict it.
FORCED_DEVICES_FLAG = "--xla_force_host_platform_device_count"


def free_port() -> int:
    """A TCP port nobody listens on now (the coordinator binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def add_launcher_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--processes", type=int, default=1, help="number of processes (N)")
    parser.add_argument(
        "--devices-per-process", type=int, default=1, help="fake CPU devices in each process"
    )
    parser.add_argument("--port", type=int, default=0, help="coordinator port (0: a free one)")
    parser.add_argument("--log-dir", default=None, help="process logs (default: <workdir>/logs)")


def _xla_flags_without_forced_devices() -> str | None:
    flags = os.environ.get("XLA_FLAGS")
    if flags is None or FORCED_DEVICES_FLAG not in flags:
        return None
    return " ".join(flag for flag in flags.split() if not flag.startswith(FORCED_DEVICES_FLAG))


def commands_for_run(run: Run, options: argparse.Namespace) -> list[Command]:
    """mkdir for the logs, then one background process per process id."""
    if options.processes < 1 or options.devices_per_process < 1:
        raise LaunchError("--processes and --devices-per-process must be at least 1")
    port = options.port or free_port()
    logs = options.log_dir or f"{run.workdir}/logs"
    if url_scheme(logs) is not None:
        raise LaunchError(
            f"process logs go to files on this machine, not to {logs}: pass --log-dir DIR"
        )
    argv = tuple(run.train_argv(shlex.split(options.program)))
    shared = {
        "JAX_PLATFORMS": "cpu",
        "ATTNMT_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
        "ATTNMT_NUM_PROCESSES": str(options.processes),
        "ATTNMT_LOCAL_DEVICE_COUNT": str(options.devices_per_process),
    }
    xla_flags = _xla_flags_without_forced_devices()
    if xla_flags is not None:
        shared["XLA_FLAGS"] = xla_flags
    commands = [command("mkdir", "-p", logs)]
    for process_id in range(options.processes):
        env = {**shared, "ATTNMT_PROCESS_ID": str(process_id)}
        log = f"{logs}/process_{process_id}.log"
        commands.append(Command(argv, env=env, log=log, background=True))
    return commands


def _main(argv: list[str] | None) -> int:
    rest, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="launch/local.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    add_run_arguments(parser, DEFAULT_PROGRAM)
    add_launcher_arguments(parser)
    add_dry_run_argument(parser)
    args = parser.parse_args(rest)
    run = run_from_args(args, overrides)
    return execute(commands_for_run(run, args), args.dry_run)


def main(argv: list[str] | None = None) -> int:
    return main_guard(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
