"""Cloud TPU VM slices through `gcloud compute tpus tpu-vm`: create, install, mount, run,
logs, stop, delete. Every worker of a slice runs the same command (`--worker=all`) with
ATTNMT_CLUSTER=tpu_vm, which tells attnmt that this is a Cloud TPU VM slice: it then reads
the slice's workers and this worker's number from the TPU metadata server and hands them to
jax.distributed.initialize (a Cloud TPU VM sets no TPU_WORKER_HOSTNAMES, unlike GKE; see
src/attnmt/parallel/distributed.py).

    python launch/tpu_vm.py create  --tpu ende --zone us-central2-b --accelerator-type v4-32
    python launch/tpu_vm.py install --tpu ende --zone us-central2-b            # this repo's HEAD
    python launch/tpu_vm.py mount   --tpu ende --zone us-central2-b --bucket BUCKET   # optional
    python launch/tpu_vm.py run     --tpu ende --zone us-central2-b \
        --config configs/wmt14_ende.py:variant=base --workdir gs://BUCKET/runs/ende_base
    python launch/tpu_vm.py logs    --tpu ende --zone us-central2-b --name ende_base --follow
    python launch/tpu_vm.py stop    --tpu ende --zone us-central2-b --name ende_base
    python launch/tpu_vm.py delete  --tpu ende --zone us-central2-b

Install ships the repository (configs included) to ~/attnmt on every worker: `--source repo`
(default) copies `git archive HEAD` of this checkout, so commit first; `--source git` clones
--git-url at --ref there; `--source wheel` installs --wheel and copies configs/ beside it.
The runtime image's Python is 3.10 and attnmt needs 3.11 (jax 0.10, flax 0.12.8), so install
puts uv in ~/.local (pip install --user) and makes a Python 3.11 environment ~/attnmt-venv
(uv fetches that Python when the image lacks it), then installs attnmt with --extras (default
tfds,gcs: gcs serves gs:// workdirs) and jax[tpu], held to constraints/tpu.txt, the tested
set. `run` puts ~/attnmt-venv/bin first on PATH, so the default program is that Python's.
A multi-host slice needs a workdir every worker shares, since each host writes its part of
every checkpoint there: a gs:// path (attnmt writes the bucket itself, with the VM's service
account), or a path under a mount every worker has at the same place. `mount` installs
gcsfuse on every worker (from Google's apt repository) and mounts --bucket at --mount-path
(default /mnt/shared); a Filestore volume mounted by hand works the same way.
Training runs under nohup with its log in ~/attnmt-logs/<name>.log and its pid beside it
(stop sends SIGTERM: the run checkpoints, then exits).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as `python launch/tpu_vm.py`: make `launch` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launch.common import (
    REPO_ROOT,
    Command,
    LaunchError,
    Run,
    add_dry_run_argument,
    add_run_arguments,
    check_name,
    command,
    execute,
    main_guard,
    parse_env,
    require_tool,
    run_from_args,
    slug,
    split_overrides,
    url_scheme,
    warn_if_uncommitted,
)

TOOL = "gcloud"
GCLOUD = ("gcloud", "compute", "tpus", "tpu-vm")
# python3 of REMOTE_VENV, which `run` puts first on PATH (a console script in ~/.local/bin
# would not be on a plain ssh's PATH).
DEFAULT_PROGRAM = "python3 -m attnmt.cli.main"
REMOTE_REPO = "attnmt"  # under the remote home
REMOTE_VENV = "attnmt-venv"  # under the remote home: the Python 3.11 environment
# The uv that made constraints/*.txt; it makes the environment and installs into it.
UV_REQUIREMENT = "uv==0.13.9"
REMOTE_UV = ".local/bin/uv"  # where `pip install --user` puts it, under the remote home
DEFAULT_PYTHON = "3.11"  # the Python constraints/tpu.txt was resolved for
DEFAULT_EXTRAS = "tfds,gcs"
DEFAULT_CONSTRAINTS = "constraints/tpu.txt"  # relative to the shipped repository
# Set on every worker: attnmt.parallel.distributed reads it as "a Cloud TPU VM slice".
CLUSTER_ENV = {"ATTNMT_CLUSTER": "tpu_vm"}
REMOTE_LOGS = "attnmt-logs"
ARCHIVE_NAME = "attnmt-src.tar.gz"
# Runtime images by accelerator family (Cloud TPU docs: "TPU software versions").
RUNTIME_VERSIONS = {
    "v5litepod": "v2-alpha-tpuv5-lite",
    "v6e": "v2-alpha-tpuv6e",
}
DEFAULT_RUNTIME_VERSION = "tpu-ubuntu2204-base"  # v2, v3, v4, v5p


def _gcloud(verb: str, positional: list[str], options: argparse.Namespace, *flags: str) -> Command:
    argv = [*GCLOUD, verb, *positional, f"--zone={options.zone}"]
    if options.project:
        argv.append(f"--project={options.project}")
    return command(*argv, *flags)


def _ssh(options: argparse.Namespace, remote: str, worker: str = "all") -> Command:
    return _gcloud("ssh", [options.tpu], options, f"--worker={worker}", f"--command={remote}")


def create_commands(options: argparse.Namespace) -> list[Command]:
    family = options.accelerator_type.split("-")[0]
    version = options.version or RUNTIME_VERSIONS.get(family, DEFAULT_RUNTIME_VERSION)
    flags = [f"--accelerator-type={options.accelerator_type}", f"--version={version}"]
    if options.spot:
        flags.append("--spot")
    if options.preemptible:
        flags.append("--preemptible")
    return [_gcloud("create", [options.tpu], options, *flags)]


def _home(path: str) -> str:
    """A path under the remote home, double-quoted so that $HOME expands and nothing globs."""
    return f'"$HOME/{path}"'


def _pip_install(path: str, options: argparse.Namespace, editable: bool = False) -> str:
    """uv, a Python --python environment, then ~/<path> with --extras and the accelerator's
    jax (--jax) installed into it under --constraints."""
    uv = _home(REMOTE_UV)
    venv = _home(REMOTE_VENV)
    extras = f"[{options.extras}]" if options.extras else ""
    target = ("-e " if editable else "") + _home(path + extras)
    jax = f" {shlex.quote(options.jax)}" if options.jax else ""
    constraint = ""
    if options.constraints:
        constraint = f" --constraint {_home(REMOTE_REPO + '/' + options.constraints)}"
    return (
        f"python3 -m pip install --quiet --user {shlex.quote(UV_REQUIREMENT)}"
        f" && {uv} venv --quiet --allow-existing --python {shlex.quote(options.python)} {venv}"
        f" && {uv} pip install --quiet --python {_home(REMOTE_VENV + '/bin/python')}"
        f"{constraint} {target}{jax}"
    )


def install_commands(options: argparse.Namespace) -> list[Command]:
    if options.source == "git":
        if not options.git_url:
            raise LaunchError("--source git needs --git-url")
        remote = (
            f"( [ -d {_home(REMOTE_REPO + '/.git')} ] || git clone --quiet "
            f"{shlex.quote(options.git_url)} {_home(REMOTE_REPO)} ) && cd {_home(REMOTE_REPO)}"
            f" && git fetch --quiet origin {shlex.quote(options.ref)}"
            " && git checkout --quiet --detach FETCH_HEAD && "
            + _pip_install(REMOTE_REPO, options, editable=True)
        )
        return [_ssh(options, remote)]
    if options.source == "wheel":
        if not options.wheel:
            raise LaunchError("--source wheel needs --wheel FILE")
        wheel = Path(options.wheel).name
        # configs/ for --config, constraints/ for the install itself.
        folders = [str(REPO_ROOT / "configs"), str(REPO_ROOT / "constraints")]
        return [
            _ssh(options, f"mkdir -p {_home(REMOTE_REPO)}"),
            _gcloud("scp", [options.wheel, f"{options.tpu}:{wheel}"], options, "--worker=all"),
            _gcloud(
                "scp",
                [*folders, f"{options.tpu}:{REMOTE_REPO}/"],
                options,
                "--worker=all",
                "--recurse",
            ),
            _ssh(options, _pip_install(wheel, options)),
        ]
    archive = str(Path(tempfile.gettempdir()) / ARCHIVE_NAME)
    warn_if_uncommitted("what install sends")
    remote = (
        f"mkdir -p {_home(REMOTE_REPO)} && tar -xzf {_home(ARCHIVE_NAME)} -C {_home(REMOTE_REPO)}"
        " && " + _pip_install(REMOTE_REPO, options, editable=True)
    )
    archive_head = (
        "git",
        "-C",
        str(REPO_ROOT),
        "archive",
        "--format=tar.gz",
        f"--output={archive}",
    )
    return [
        command(*archive_head, "HEAD"),
        _gcloud("scp", [archive, f"{options.tpu}:{ARCHIVE_NAME}"], options, "--worker=all"),
        _ssh(options, remote),
    ]


GCSFUSE_APT = (
    'echo "deb [signed-by=/usr/share/keyrings/cloud.google.asc] '
    'https://packages.cloud.google.com/apt gcsfuse-$(lsb_release -c -s) main"'
    " | sudo tee /etc/apt/sources.list.d/gcsfuse.list > /dev/null"
    " && curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg"
    " | sudo tee /usr/share/keyrings/cloud.google.asc > /dev/null"
    " && sudo apt-get update -qq && sudo apt-get install -y -qq gcsfuse"
)
# implicit-dirs: see folders other workers made. rename-dir-limit: Orbax commits a
# checkpoint by renaming its temporary folder, which gcsfuse refuses by default.
GCSFUSE_FLAGS = ("--implicit-dirs", "--rename-dir-limit=200000")


def mount_commands(options: argparse.Namespace) -> list[Command]:
    """gcsfuse on every worker (installed if missing), the bucket at the same path on each;
    a worker where it is mounted already is left as it is."""
    bucket = options.bucket.removeprefix("gs://").rstrip("/")
    if not bucket or "/" in bucket:
        raise LaunchError(
            f"--bucket wants a bucket name (my-bucket or gs://my-bucket), got {options.bucket!r}"
        )
    path = shlex.quote(options.mount_path)
    gcsfuse = shlex.join(["gcsfuse", *GCSFUSE_FLAGS, bucket, options.mount_path])
    remote = (
        f"set -e; command -v gcsfuse > /dev/null || {{ {GCSFUSE_APT}; }}; "
        f'sudo mkdir -p {path} && sudo chown "$(id -u):$(id -g)" {path}; '
        f"mountpoint -q {path} || {gcsfuse}"
    )
    return [_ssh(options, remote)]


def tpu_name(template: str, run: Run) -> str:
    """--tpu may hold `{run}` so that a sweep puts each run on its own slice."""
    return template.replace("{run}", slug(run.name))


def commands_for_run(run: Run, options: argparse.Namespace) -> list[Command]:
    """The run on every worker: in the background under nohup, or attached (--foreground)."""
    if url_scheme(run.workdir) is None and not run.workdir.startswith("/"):
        print(
            f"launch: note: workdir {run.workdir} is relative to ~/attnmt on each worker; a "
            "multi-host slice needs a path every worker shares (gs://, or a gcsfuse or Filestore "
            "mount)",
            file=sys.stderr,
        )
    env = "".join(f"{k}={shlex.quote(v)} " for k, v in parse_env(options.env).items())
    train = shlex.join(run.train_argv(shlex.split(options.program)))
    log = _home(f"{REMOTE_LOGS}/{run.name}.log")
    # The environment install made comes first on PATH; --env can still override the rest.
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in CLUSTER_ENV.items())
    path = f'PATH="$HOME/{REMOTE_VENV}/bin:$PATH"'
    prefix = (
        f"mkdir -p {_home(REMOTE_LOGS)} && cd {_home(REMOTE_REPO)} && export {path} {exports} && "
    )
    if options.foreground:
        remote = f"set -o pipefail; {prefix}{env}{train} 2>&1 | tee -a {log}"
    else:
        pid = _home(f"{REMOTE_LOGS}/{run.name}.pid")
        # Braces: `&` must background nohup alone, so that $! is the training process.
        remote = f"{prefix}{{ {env}nohup {train} >> {log} 2>&1 < /dev/null & echo $! > {pid}; }}"
    ssh_options = argparse.Namespace(**{**vars(options), "tpu": tpu_name(options.tpu, run)})
    return [_ssh(ssh_options, remote)]


def logs_commands(options: argparse.Namespace) -> list[Command]:
    follow = " -F" if options.follow else ""
    remote = f"tail -n {options.lines}{follow} {_home(f'{REMOTE_LOGS}/{options.name}.log')}"
    return [_ssh(options, remote, worker=options.worker)]


def stop_commands(options: argparse.Namespace) -> list[Command]:
    remote = f'kill -TERM "$(cat {_home(f"{REMOTE_LOGS}/{options.name}.pid")})"'
    return [_ssh(options, remote)]


def delete_commands(options: argparse.Namespace) -> list[Command]:
    return [_gcloud("delete", [options.tpu], options, "--quiet")]


def add_launcher_arguments(parser: argparse.ArgumentParser) -> None:
    """Where runs go: the slice (`{run}` in --tpu is replaced by the run's name)."""
    parser.add_argument("--tpu", required=True, help="TPU VM name (a sweep may use {run})")
    parser.add_argument("--zone", required=True)
    parser.add_argument("--project", default=None)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the run")
    parser.add_argument(
        "--foreground", action="store_true", help="stay attached until training ends"
    )


def _slice_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tpu", required=True, help="TPU VM name")
    parser.add_argument("--zone", required=True)
    parser.add_argument("--project", default=None)
    add_dry_run_argument(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch/tpu_vm.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    verbs = parser.add_subparsers(dest="verb", required=True)

    create = verbs.add_parser("create", help="create a TPU VM slice")
    _slice_arguments(create)
    create.add_argument("--accelerator-type", required=True, help="v4-32, v5litepod-16, ...")
    create.add_argument("--version", default=None, help="runtime (default: by accelerator)")
    kind = create.add_mutually_exclusive_group()
    kind.add_argument("--spot", action="store_true", help="Spot VMs (preemptible, cheaper)")
    kind.add_argument("--preemptible", action="store_true")

    install = verbs.add_parser("install", help="ship the code and pip install it on all workers")
    _slice_arguments(install)
    install.add_argument("--source", choices=["repo", "git", "wheel"], default="repo")
    install.add_argument("--git-url", default=None)
    install.add_argument("--ref", default="main", help="branch, tag or commit (--source git)")
    install.add_argument("--wheel", default=None, help="a built attnmt wheel (--source wheel)")
    install.add_argument(
        "--extras",
        default=DEFAULT_EXTRAS,
        help=f"attnmt extras (default {DEFAULT_EXTRAS}; gs:// workdirs need gcs; '' for none)",
    )
    install.add_argument("--jax", default="jax[tpu]", help="accelerator jax ('' for none)")
    install.add_argument(
        "--python", default=DEFAULT_PYTHON, help="the environment's Python (uv fetches it)"
    )
    install.add_argument(
        "--constraints",
        default=DEFAULT_CONSTRAINTS,
        help="pins, relative to the shipped repository ('' for none)",
    )

    run = verbs.add_parser("run", help="start attnmt train on all workers")
    add_run_arguments(run, DEFAULT_PROGRAM)
    add_launcher_arguments(run)
    add_dry_run_argument(run)

    mount = verbs.add_parser("mount", help="mount a GCS bucket on all workers (gcsfuse)")
    _slice_arguments(mount)
    mount.add_argument("--bucket", required=True, help="bucket name (or gs://name)")
    mount.add_argument("--mount-path", default="/mnt/shared", help="the same on every worker")

    for verb, text in (("logs", "show a run's log"), ("stop", "SIGTERM a run (it checkpoints)")):
        sub = verbs.add_parser(verb, help=text)
        _slice_arguments(sub)
        sub.add_argument("--name", required=True, help="the run's name (its workdir's name)")
        if verb == "logs":
            sub.add_argument("--worker", default="0", help="worker index, or all")
            sub.add_argument("--lines", type=int, default=100)
            sub.add_argument("--follow", action="store_true")

    delete = verbs.add_parser("delete", help="delete the slice")
    _slice_arguments(delete)
    return parser


def _main(argv: list[str] | None) -> int:
    rest, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(rest)
    if overrides and args.verb != "run":
        raise LaunchError("--config.* overrides belong to the run subcommand")
    if args.verb == "run":
        commands = commands_for_run(run_from_args(args, overrides), args)
    else:
        if getattr(args, "name", None):
            args.name = check_name(args.name)
        build = {
            "create": create_commands,
            "install": install_commands,
            "mount": mount_commands,
            "logs": logs_commands,
            "stop": stop_commands,
            "delete": delete_commands,
        }[args.verb]
        commands = build(args)
    if not args.dry_run:
        require_tool(TOOL, "manage Cloud TPU VMs")
    return execute(commands, args.dry_run)


def main(argv: list[str] | None = None) -> int:
    return main_guard(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
