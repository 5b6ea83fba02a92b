"""The shared launcher layer: overrides, command lines, shell rendering, running a group."""

import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from launch.common import (
    Command,
    LaunchError,
    Run,
    execute,
    render_script,
    require_tool,
    slug,
    split_overrides,
)
from tests.launch.helpers import REPO

PYTHON = sys.executable


def test_split_overrides_takes_both_forms_and_keeps_other_flags():
    rest, overrides = split_overrides(
        ["--workdir", "w", "--config.model.d_ff=128", "--config.train.seed", "3", "--dry-run"]
    )
    assert rest == ["--workdir", "w", "--dry-run"]
    assert overrides == {"model.d_ff": "128", "train.seed": "3"}
    with pytest.raises(LaunchError, match="needs a value"):
        split_overrides(["--config.model.d_ff"])


def test_train_argv_spells_values_as_attnmt_reads_them():
    run = Run("r", "configs/tiny.py:vocab_size=64", "/mnt/b/r", {"a.b": True, "c.d": 0.1})
    assert run.train_argv(["attnmt"]) == [
        "attnmt",
        "train",
        "--config",
        "configs/tiny.py:vocab_size=64",
        "--workdir",
        "/mnt/b/r",
        "--config.a.b=true",
        "--config.c.d=0.1",
    ]


def test_slug_makes_dns_names():
    assert slug("Table3/A1_big run") == "table3-a1-big-run"
    assert len(slug("x" * 100, max_length=40)) == 40
    with pytest.raises(LaunchError):
        slug("___")


def test_rendered_command_splits_back_into_the_same_words():
    item = Command(
        ("attnmt", "train", "--config.data.src_path=/c/{split} x.src"),
        env={"A": "1 2"},
        log="/tmp/a b.log",
        background=True,
    )
    words = shlex.split(item.render())
    assert words == [
        "A=1 2",
        "attnmt",
        "train",
        "--config.data.src_path=/c/{split} x.src",
        ">",
        "/tmp/a b.log",
        "2>&1",
        "&",
    ]


def test_render_script_waits_after_each_background_group():
    background = Command(("sleep", "1"), background=True)
    text = render_script([Command(("true",)), background, background, Command(("true",))])
    assert text.splitlines() == ["true", "sleep 1 &", "sleep 1 &", "wait", "true"]


def test_execute_feeds_stdin_and_stops_at_the_first_failure(tmp_path):
    target = tmp_path / "fed.txt"
    copy = f"import sys; open({str(target)!r}, 'w').write(sys.stdin.read())"
    never = tmp_path / "never"
    code = execute(
        [
            Command((PYTHON, "-c", copy), stdin="kind: JobSet\n"),
            Command((PYTHON, "-c", "raise SystemExit(4)")),
            Command((PYTHON, "-c", f"open({str(never)!r}, 'w')")),
        ],
        dry_run=False,
    )
    assert code == 4
    assert target.read_text() == "kind: JobSet\n"
    assert not never.exists()


def test_a_failed_process_stops_the_rest_of_its_group(tmp_path):
    # The sleeper stands for a peer stuck in a collective: it must not be waited for.
    sleeper = Command((PYTHON, "-c", "import time; time.sleep(60)"), background=True)
    failing = Command(
        (PYTHON, "-c", "print('bad'); raise SystemExit(3)"),
        log=str(tmp_path / "p1.log"),
        background=True,
    )
    start = time.monotonic()
    assert execute([sleeper, failing], dry_run=False) == 3
    assert time.monotonic() - start < 20
    assert (tmp_path / "p1.log").read_text().strip() == "bad"


def test_dry_run_writes_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    with open(tmp_path / "script.sh", "w") as out:
        code = execute([Command(("touch", str(marker)))], dry_run=True, out=out)
    assert code == 0
    assert (tmp_path / "script.sh").read_text() == f"touch {marker}\n"
    assert not marker.exists()


def test_missing_tool_is_refused_with_its_name():
    with pytest.raises(LaunchError, match="no-such-cloud-cli"):
        require_tool("no-such-cloud-cli", "do things")


def test_local_launcher_passes_sigterm_on_to_its_processes(tmp_path):
    # A stand-in for attnmt: records its pid and process id, then waits to be stopped.
    record = (
        "import os, pathlib, time; "
        f"pathlib.Path({str(tmp_path)!r}, os.environ['ATTNMT_PROCESS_ID'])"
        ".write_text(str(os.getpid())); time.sleep(60)"
    )
    program = shlex.join([PYTHON, "-c", record])
    run = ["--config", "c.py", "--workdir", str(tmp_path / "run")]
    local = [PYTHON, str(REPO / "launch" / "local.py"), "--processes", "2", "--program", program]
    launcher = subprocess.Popen([*local, *run])
    deadline = time.monotonic() + 30
    while not all((tmp_path / str(i)).exists() for i in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int((tmp_path / str(i)).read_text()) for i in (0, 1)]
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=30) == 143
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_bucket_workdirs_pass_and_other_urls_are_refused_before_launching():
    run = Run("r", "configs/tiny.py", "gs://b/runs/r")
    assert run.train_argv(["attnmt"])[-2:] == ["--workdir", "gs://b/runs/r"]
    for url in ("https://example.org/r", "file:///tmp/r"):
        with pytest.raises(LaunchError, match=r"gs://"):
            Run("r", "configs/tiny.py", url)
