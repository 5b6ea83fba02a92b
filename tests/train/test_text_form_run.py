"""A run with data.text_form = "lc.norm.tok" trains on lowercased Moses tokens, translates raw
sentences and writes plain (detokenized, lowercase) text that scores as the tok/ form."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from attnmt.checkpoint.manager import CheckpointManager
from attnmt.cli.arguments import check_ensemble
from attnmt.cli.main import main
from attnmt.data.text_form import TextForm
from attnmt.data.tokenizer import Tokenizer, train_vocab
from attnmt.decode.translate import Translator
from attnmt.errors import ConfigError
from attnmt.evaluate.bleu import multi30k_bleu, multi30k_tokenize
from attnmt.workdir import load_run
from tests.helpers import EN, event_scalars, sentences, translation, word_task_overrides


def _cased(line: str) -> str:
    """ "a man runs ." → "A man runs." (raw text, as a corpus has it)."""
    text = line.removesuffix(" .") + "."
    return text[0].upper() + text[1:]


def _write(folder: Path, splits: dict[str, list[str]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, lines in splits.items():
        (folder / f"{split}.en").write_text("".join(_cased(s) + "\n" for s in lines))
        de = "".join(_cased(translation(s)) + "\n" for s in lines)
        (folder / f"{split}.de").write_text(de, encoding="utf-8")
    return folder


@pytest.mark.slow
def test_a_lowercase_tokenized_run_trains_translates_and_scores(tmp_path, capsys):
    splits = {"train": sentences(EN, 2000, 31), "dev": sentences(EN, 32, 32)}
    corpus = _write(tmp_path / "corpus", splits)
    workdir = tmp_path / "run"
    argv = [
        "train",
        "--config",
        "configs/tiny.py",
        "--workdir",
        str(workdir),
        *word_task_overrides(corpus, 200),
        "--config.data.text_form=lc.norm.tok",
        "--config.train.bleu_every_steps=100",
        "--config.train.keep_best_by=bleu",
    ]
    assert main(argv) == 0

    # The best step is ranked by Multi30K BLEU: cased sacreBLEU of lowercase output says little.
    m30k = event_scalars(workdir / "tensorboard" / "bleu", "multi30k_bleu")
    sacre = event_scalars(workdir / "tensorboard" / "bleu", "sacrebleu")
    assert sorted(m30k) == [100, 200]
    best_step, best_value = CheckpointManager(workdir).best()
    assert best_value == pytest.approx(m30k[best_step], abs=1e-4)
    assert best_value == pytest.approx(max(m30k.values()), abs=1e-4)
    assert abs(best_value - sacre[best_step]) > 1e-3

    # The vocabulary was trained on the lowercased, tokenized text.
    pieces = Tokenizer.load(workdir / "vocab.model").processor
    vocab = [pieces.id_to_piece(i) for i in range(pieces.get_piece_size())]
    assert not any(any(c.isupper() for c in p) for p in vocab if not p.startswith("<"))

    # Sources take the form before encoding: casing and attached punctuation change nothing.
    run = load_run(workdir)
    translator = Translator.from_runs([run], run.experiment.decode)
    raw = ["A man runs on the street.", "a MAN runs ON the street ."]
    sources = (corpus / "dev.en").read_text().splitlines()
    first, second = translator.translate(raw)
    assert first == second
    assert first == first.lower() and not first.endswith(" .")  # detokenized output

    capsys.readouterr()
    assert main(["evaluate", "--workdir", str(workdir), "--split", "dev", "--beam", "2"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"sacreBLEU .*\(cased: this run writes lowercase\)", out)
    hypotheses = (workdir / "decodes" / "dev-step200-beam2.de").read_text().splitlines()
    references = (corpus / "dev.de").read_text(encoding="utf-8").splitlines()
    assert all(h == h.lower() and not h.endswith(" .") for h in hypotheses)
    expected = multi30k_bleu(hypotheses, multi30k_tokenize(references, lang="de"), lang="de")
    (printed,) = (float(x) for x in re.findall(r"Multi30K BLEU\s+([0-9.]+)", out))
    assert printed == pytest.approx(expected.score, abs=0.006)
    # Scored in the form the model emits: the same run's raw decoder output (tokens of the
    # tok/ form) is what the written hypotheses tokenize back to, line for line.
    emitted = Translator(
        [run.experiment.model], [run.params], run.tokenizer, run.experiment.decode
    ).translate([TextForm.of(run.experiment.data).source(s) for s in raw + sources])
    assert any("." in line.split() for line in emitted)  # tokens, not text
    assert multi30k_tokenize(translator.translate(raw + sources), lang="de") == emitted

    # Head ablation ranks by the same Multi30K BLEU (not a Multi30K source) and names it.
    ablation = tmp_path / "ablation"
    command = ["attention", "--workdir", str(workdir), "--beam", "1", "--ablate"]
    command += ["--split", "dev", "-n", "4", "--out", str(ablation)]
    assert main(command) == 0
    table = (ablation / "ablation.md").read_text().split("```\n")[1]
    assert table.splitlines()[1].split()[3] == "multi30k_bleu"  # the column header
    greedy = dataclasses.replace(run.experiment.decode, beam_size=1)
    first_four = Translator.from_runs([run], greedy).translate(sources[:4])
    expected = multi30k_bleu(first_four, multi30k_tokenize(references[:4], lang="de"), lang="de")
    (full,) = re.findall(r"^full model: multi30k_bleu ([0-9.]+)$", table, flags=re.M)
    assert float(full) == pytest.approx(expected.score, abs=0.006)

    # An ensemble's members must read one input form and share one vocabulary.
    check_ensemble([run, run])
    data = dataclasses.replace(run.experiment.data, text_form="raw")
    cased = dataclasses.replace(run, experiment=dataclasses.replace(run.experiment, data=data))
    with pytest.raises(ConfigError, match=r"text_form='raw'.*'lc\.norm\.tok'"):
        check_ensemble([run, cased])
    train_vocab([_cased(s) for s in splits["train"]], tmp_path / "other.model", 60)
    other = dataclasses.replace(run, tokenizer=Tokenizer.load(tmp_path / "other.model"))
    with pytest.raises(ConfigError, match="its vocabulary differs"):
        check_ensemble([run, other])
