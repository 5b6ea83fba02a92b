"""`attnmt report` on hand-made workdirs: which scalars count, steps, BLEU, sorting, CSV."""

import csv
import json
import struct

import pytest
from tensorboardX import SummaryWriter

from attnmt.cli.main import main as attnmt_main
from attnmt.cli.report import ReportError, gather, markdown_table, read_scalars
from attnmt.config import load_experiment
from attnmt.model.param_count import count_parameters
from tests.helpers import TINY_CONFIG


def _write(directory, step, scalars, walltime, name=None):
    """One event file, as one SummaryWriter leaves it, with `scalars` at `step` and `walltime`.

    tensorboardX names a file by the whole second and opens it with "wb": two writers in the
    same second would share one file, the second erasing the first. So each writer gets a
    scratch folder, and its file is then moved in under `name` (by default one that sorts
    by wall time, like the real names do).
    """
    scratch = directory / "scratch"
    writer = SummaryWriter(str(scratch))
    for tag, value in scalars.items():
        writer.add_scalar(tag, value, step, walltime=walltime)
    writer.close()
    (path,) = scratch.iterdir()
    target = directory / (name or f"events.out.tfevents.{int(walltime)}.host")
    assert not target.exists()
    path.rename(target)
    scratch.rmdir()
    return target


def _make_run(workdir, d_ff=64, steps=(), dev=(), bleu=(), bleu_split=None):
    """A workdir as training leaves it: config.json, checkpoint folders, event files."""
    experiment = load_experiment(str(TINY_CONFIG), {"model.d_ff": d_ff})
    workdir.mkdir(parents=True)
    (workdir / "config.json").write_text(json.dumps(experiment.to_dict()))
    for step in steps:
        (workdir / "checkpoints" / str(step)).mkdir(parents=True)
    # One event file per evaluation, written an hour apart (wall time in seconds).
    for step, ppl in dev:
        scalars = {"perplexity": ppl, "loss": ppl / 10}
        _write(workdir / "tensorboard" / "eval", step, scalars, walltime=1e9 + 3600 * step)
    for step, score in bleu:
        scores = {"sacrebleu": score - 1, "tokenized_bleu": score}
        _write(workdir / "tensorboard" / (bleu_split or "bleu"), step, scores, 1e9 + 3600 * step)
    return experiment


def test_gather_reads_the_newest_values_of_every_run(tmp_path):
    experiment = _make_run(
        tmp_path / "C10", steps=[100, 200], dev=[(100, 9.0), (200, 7.5)], bleu=[(200, 21.0)]
    )
    _make_run(tmp_path / "sub" / "C2", d_ff=128, steps=[50], dev=[(50, 12.0)])
    _make_run(tmp_path / "C3", bleu=[(10, 5.0)], bleu_split="bleu_dev")  # from attnmt evaluate
    (tmp_path / "C10" / "checkpoints" / "300.orbax-checkpoint-tmp-1").mkdir()  # unfinished save

    summaries = gather(str(tmp_path))
    assert [s.name for s in summaries] == ["C3", "C10", "sub/C2"]
    c3, c10, c2 = summaries
    assert c10.steps == 200
    assert c10.dev["perplexity"] == pytest.approx(7.5)
    assert c10.dev["loss"] == pytest.approx(0.75)
    assert c10.dev_bleu == pytest.approx(21.0)  # tokenized BLEU, the paper's, over sacreBLEU
    assert c10.params == count_parameters(experiment.model)["total"]
    assert c2.section("model")["d_ff"] == 128 and c2.params > c10.params
    assert c3.steps is None and c3.dev == {} and c3.dev_bleu == pytest.approx(5.0)

    table = markdown_table(summaries).splitlines()
    assert len(table) == 2 + 3
    assert table[0].startswith("| run | N | d_model | d_ff | h | d_k | d_v | P_drop | ε_ls |")
    cells = [cell.strip() for cell in table[3].strip("|").split("|")]
    assert cells[0] == "C10" and cells[9:12] == ["200", "7.50", "21.0"]


@pytest.mark.parametrize(
    "names", [("a", "b"), ("b", "a")], ids=["names_in_time_order", "names_out_of_time_order"]
)
def test_a_resumed_run_reports_its_latest_values_and_a_torn_tail_is_ignored(tmp_path, names):
    # The run reached step 300, crashed, and was resumed from its step 200 checkpoint: the
    # newer value is at the lower step. Both files are named in the same second, so only
    # their suffixes order them, either way round: neither the higher step nor the last
    # file may win, only the newer wall time.
    directory = tmp_path / "eval"
    first, resumed = (f"events.out.tfevents.1000000000.host.{name}" for name in names)
    _write(directory, 300, {"perplexity": 5.0}, walltime=1e9 + 0.25, name=first)
    newest = _write(directory, 200, {"perplexity": 6.0}, walltime=1e9 + 0.75, name=resumed)
    assert len(list(directory.iterdir())) == 2
    # The resumed run is killed while writing step 250: its last record is cut short.
    torn = _write(tmp_path / "torn", 250, {"perplexity": 7.0}, walltime=1e9 + 1.5).read_bytes()
    # TFRecord framing: uint64 length, 4-byte crc, payload, 4-byte crc. The file holds the
    # file_version event, then the step 250 one; its header stays whole, its payload is cut.
    (length,) = struct.unpack("<Q", torn[:8])
    record = torn[8 + 4 + length + 4 :]
    assert len(record) == 8 + 4 + struct.unpack("<Q", record[:8])[0] + 4
    with open(newest, "ab") as handle:
        handle.write(record[:-9])
    scalar = read_scalars(directory)["perplexity"]
    assert (scalar.step, scalar.wall_time, scalar.value) == (200, 1e9 + 0.75, 6.0)


def test_main_writes_the_csv_and_refuses_an_empty_folder(tmp_path):
    _make_run(tmp_path / "runs" / "a", steps=[10], dev=[(10, 3.0)])
    _make_run(tmp_path / "runs" / "b", steps=[20], dev=[(20, 4.0)])
    out = tmp_path / "table.csv"
    assert attnmt_main(["report", str(tmp_path / "runs"), "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [row["run"] for row in rows] == ["a", "b"]
    assert float(rows[1]["dev_ppl"]) == pytest.approx(4.0)
    assert rows[0]["steps"] == "10" and rows[0]["dev_bleu"] == ""

    (tmp_path / "empty").mkdir()
    assert attnmt_main(["report", str(tmp_path / "empty")]) == 2
    with pytest.raises(ReportError):
        gather(str(tmp_path / "empty"))
