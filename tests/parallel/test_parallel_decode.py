"""Decoding in a real 2-process job (2 CPU devices each, gloo, coordinator on 127.0.0.1):
every process decodes its rows, process 0 alone writes, and what it writes is what one
process writes. A 2-process `attnmt train` (parameters split over both processes) computes
BLEU during training and prints its test BLEU at the end (process 0): the BLEU of one
process's translations of the test split; `attnmt translate` of the same lines and an
empty one writes, on process 0, the file one process writes."""

from __future__ import annotations

import random
import re

import pytest

from attnmt.cli.main import main
from attnmt.evaluate.bleu import sacre_bleu
from tests.helpers import reversal_text
from tests.parallel.jobs import PROBE, job_env, read_probes, run_job, train_args, write_corpus

STEPS = 4
# Decoding kept small: 2 beams, outputs up to 5 tokens past the input, XLA level 0.
DECODE = (
    "--config.decode.beam_size=2",
    "--config.decode.max_len_offset=5",
    "--config.decode.batch_sentences=4",
    "--config.decode.xla_backend_optimization_level=0",
)
SACREBLEU = re.compile(r"sacreBLEU\s+(\S+)")


def _checked(results: list[tuple[int, str]]) -> list[str]:
    for code, output in results:
        assert code == 0, output[-3000:]
    return [output for _, output in results]


@pytest.mark.slow
def test_two_processes_decode_what_one_process_decodes(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    src, tgt = reversal_text(random.Random(5), 6)
    for split in ("dev", "test"):  # BLEU during training on the same sentences
        (corpus / f"{split}.src").write_text(src)
        (corpus / f"{split}.tgt").write_text(tgt)
    workdir, env = tmp_path / "run", job_env(tmp_path / "cache")
    # Parameters split over all 4 devices (FSDP): BLEU during training gathers them from
    # both processes first.
    fsdp = ("--config.parallel.data=1", "--config.parallel.fsdp=4")
    bleu = (f"--config.train.bleu_every_steps={STEPS}",)
    trained = _checked(
        run_job(
            [*PROBE, *train_args(corpus, workdir, STEPS, *DECODE, *fsdp, *bleu)],
            tmp_path / "train",
            {**env, "ATTNMT_PROBE_DIR": str(tmp_path / "train_probes")},
        )
    )
    # Both processes decoded the test split; process 0 alone printed and wrote it.
    assert "test: 6 sentences" in trained[0] and "sacreBLEU" not in trained[1]
    during = re.findall(rf"\[bleu\] step {STEPS} sacrebleu=(\S+)", trained[0])
    assert during == re.findall(rf"\[bleu_test\] step {STEPS} sacrebleu=(\S+)", trained[0])
    assert len(during) == 1
    hypotheses = workdir / f"decodes/test-step{STEPS}-beam2.tgt"
    written = [probe.written for probe in read_probes(tmp_path / "train_probes")]
    assert str(hypotheses.relative_to(workdir)) in written[0]
    assert not [path for path in written[1] if path.startswith("decodes")]

    # The test split and an empty line, translated by 2 processes (4 devices, 7 lines).
    source = tmp_path / "input.txt"
    source.write_text(src + "\n")
    translate = ["translate", "--workdir", str(workdir), "--input", str(source)]
    (tmp_path / "translate_probes").mkdir()
    _checked(
        run_job(
            [*PROBE, *translate, "--output", str(workdir / "two.txt")],
            tmp_path / "translate",
            {**env, "ATTNMT_PROBE_DIR": str(tmp_path / "translate_probes")},
        )
    )
    written = [probe.written for probe in read_probes(tmp_path / "translate_probes")]
    assert "two.txt" in written[0] and "two.txt" not in written[1]

    # One process (this one, its 8 devices) writes the same lines; the training job's
    # test BLEU is theirs.
    assert main([*translate, "--output", str(tmp_path / "one.txt")]) == 0
    one = (tmp_path / "one.txt").read_text().split("\n")
    assert (workdir / "two.txt").read_text().split("\n") == one
    assert len(one) == 8 and one[6:] == ["", ""]  # 7 lines, the last one empty
    assert hypotheses.read_text().split("\n") == [*one[:6], ""]
    score = sacre_bleu(one[:6], tgt.splitlines()).score
    assert SACREBLEU.findall(trained[0]) == [f"{score:.2f}"]
