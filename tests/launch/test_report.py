"""`attnmt report` on hand-made workdirs: which scalars count, steps, BLEU, sorting, CSV."""

import csv
import json
import time

import pytest
from tensorboardX import SummaryWriter

from attnmt.cli.config_file import load_config_file
from attnmt.experiment import Experiment
from attnmt.model.param_count import count_parameters
from attnmt.report import ReportError, gather, main, markdown_table, read_scalars
from tests.test_config import CONFIGS


def _write(directory, step, scalars):
    writer = SummaryWriter(str(directory))
    for tag, value in scalars.items():
        writer.add_scalar(tag, value, step)
    writer.close()


def _make_run(workdir, d_ff=64, steps=(), dev=(), bleu=(), bleu_split=None):
    """A workdir as training leaves it: config.json, checkpoint folders, event files."""
    config = load_config_file(str(CONFIGS / "tiny.py"))
    config.model.d_ff = d_ff
    experiment = Experiment.from_mapping(config)
    workdir.mkdir(parents=True)
    (workdir / "config.json").write_text(json.dumps(experiment.to_dict()))
    for step in steps:
        (workdir / "checkpoints" / str(step)).mkdir(parents=True)
    for step, ppl in dev:
        _write(workdir / "tensorboard" / "eval", step, {"perplexity": ppl, "loss": ppl / 10})
    for step, score in bleu:
        scores = {"sacrebleu": score - 1, "tokenized_bleu": score}
        _write(workdir / "tensorboard" / (bleu_split or "bleu"), step, scores)
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


def test_a_resumed_run_reports_its_latest_values_and_a_torn_tail_is_ignored(tmp_path):
    directory = tmp_path / "eval"
    _write(directory, 300, {"perplexity": 5.0})
    time.sleep(0.01)
    _write(directory, 200, {"perplexity": 6.0})  # resumed from step 200 after a crash
    newest = sorted(directory.iterdir())[-1]
    with open(newest, "ab") as handle:
        handle.write(b"\x10\x00\x00")  # a record cut short by a killed writer
    scalar = read_scalars(directory)["perplexity"]
    assert (scalar.step, scalar.value) == (200, 6.0)


def test_main_writes_the_csv_and_refuses_an_empty_folder(tmp_path):
    _make_run(tmp_path / "runs" / "a", steps=[10], dev=[(10, 3.0)])
    _make_run(tmp_path / "runs" / "b", steps=[20], dev=[(20, 4.0)])
    out = tmp_path / "table.csv"
    assert main([str(tmp_path / "runs"), "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [row["run"] for row in rows] == ["a", "b"]
    assert float(rows[1]["dev_ppl"]) == pytest.approx(4.0)
    assert rows[0]["steps"] == "10" and rows[0]["dev_bleu"] == ""

    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    with pytest.raises(ReportError):
        gather(str(tmp_path / "empty"))
