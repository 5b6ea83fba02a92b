"""The WMT'14 recipe of docs/REPRODUCING.md, run as written on TFDS mock data.

The block between the `wmt14-recipe` markers is read line by line: variables are set,
launchers render their commands for the gs:// bucket as written, and what runs here runs
with the bucket replaced by a local folder. `python -c` data preparation runs under
`tensorflow_datasets.testing.mock_data` (where download_and_prepare is a no-op and every
split yields random text with the dataset's features), each launcher line runs with
`--dry-run`, and the `attnmt train` command a launcher would start on its workers is run
here with a tiny model appended, as are the `attnmt average` and `attnmt evaluate` lines.
So a renamed flag, a config key that does not exist, a launcher that renders another
command, or an average of more checkpoints than the schedule keeps, fails this test. Each
run trains one checkpoint more than it averages, and the averaged parameters are checked
against the float64 mean of exactly the last K (5 base, 20 big: §6.1) of the checkpoints
on disk, read here with Orbax directly.
Also: the cost estimate quoted there (bench/pod_cost.py) against hand arithmetic.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import yaml

from tests.helpers import TINY_MODEL_OVERRIDES
from tests.launch.helpers import REPO, launch, shell_commands, train_part

tfds = pytest.importorskip("tensorflow_datasets")

from attnmt.cli.main import main  # noqa: E402

DOC = REPO / "docs" / "REPRODUCING.md"
BEGIN, END = "<!-- wmt14-recipe: begin", "<!-- wmt14-recipe: end -->"
# §6.1: base models average the last 5 checkpoints, big ones the last 20.
AVERAGED = {"base": 5, "big": 20}
EXTRA_STEPS = 1  # a checkpoint beyond the averaged ones, which the average must leave out
# An untrained model emits until the length limit: a short limit keeps decoding short.
FAST_DECODE = [
    "--config.decode.xla_backend_optimization_level=0",
    "--config.decode.max_len_offset=4",
]
# A model small enough to compile and train in seconds, one bucket shape (one compile), a
# checkpoint after every update, and the test BLEU at the end decoded as cheaply as above.
TINY = [
    *TINY_MODEL_OVERRIDES,
    "--config.model.vocab_size=40",
    "--config.data.tokens_per_batch=512",
    "--config.data.max_length=16",
    "--config.data.min_bucket_length=16",
    "--config.train.checkpoint_every_steps=1",
    "--config.train.eval_every_steps=0",
    "--config.train.log_every_steps=10",
    "--config.train.memory_preflight=false",
    "--config.train.xla_backend_optimization_level=0",
    "--config.parallel.num_devices=1",
    *FAST_DECODE,
]
SENTENCES = 32  # per split of the mock dataset


def recipe_lines(text: str) -> list[str]:
    """The logical lines of the marked bash block: continuations joined, comments and
    blank lines dropped."""
    block = text[text.index(BEGIN) : text.index(END)]
    body = block.split("```bash\n", 1)[1].rsplit("```", 1)[0]
    lines, pending = [], ""
    for raw in body.splitlines():
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = (pending + raw).strip()
        pending = ""
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def expand(line: str, variables: dict[str, str]) -> str:
    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        assert name in variables, f"the recipe uses ${name} before setting it: {line}"
        return variables[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, line)


class Recipe:
    """Runs the recipe's lines; `execute=False` only checks them (dry runs, configs)."""

    def __init__(self, local_bucket: str, execute: bool, pair: str | None = None) -> None:
        self.local_bucket = local_bucket
        self.pair = pair
        self.execute = execute
        self.variables: dict[str, str] = {}
        self.trained: dict[str, list[str]] = {}  # workdir -> the train argv run there
        self.ran: list[str] = []

    def run(self, line: str) -> None:
        assignment = re.fullmatch(r"([A-Z_]+)=(\S+)(\s+#.*)?", line)
        if assignment:
            name, value = assignment.group(1), assignment.group(2)
            self.variables[name] = self.pair if name == "PAIR" and self.pair else value
            return
        words = shlex.split(expand(line, self.variables), comments=True)
        if words[:2] == ["python", "-c"]:
            exec(self.local(words)[2], {})  # under mock_data: prepares, downloads nothing
            self.ran.append("prepare")
        elif words[0] == "python" and words[1].startswith("launch/"):
            self.launcher(Path(words[1]).stem, words[2:])
        elif words[0] == "attnmt":
            self.attnmt(self.local(words)[1:])
        else:
            raise AssertionError(f"the recipe runs something this test does not know: {line}")

    def local(self, words: list[str]) -> list[str]:
        """`words` with the recipe's bucket replaced by the local folder."""
        bucket = self.variables["BUCKET"]
        assert bucket.startswith("gs://"), "the recipe's workdirs should be in a bucket"
        return [word.replace(bucket, self.local_bucket) for word in words]

    def launcher(self, script: str, args: list[str]) -> None:
        result = launch(script, *args, "--dry-run")
        assert result.returncode == 0, f"{script} {shlex.join(args)}: {result.stderr}"
        self.ran.append(f"{script} {args[0] if script == 'tpu_vm' else ''}".strip())
        train = self.train_command(script, args, result.stdout)
        if train is not None:
            self.train(self.local(train))

    @staticmethod
    def train_command(script: str, args: list[str], output: str) -> list[str] | None:
        """The `train ...` words a launcher starts on its workers, if it starts training."""
        if script == "tpu_vm" and args[0] == "run":
            ((ssh, _),) = shell_commands(output)
            (remote,) = [w.removeprefix("--command=") for w in ssh if w.startswith("--command=")]
            return train_part(shlex.split(remote))
        if script == "gke":
            ((_, manifest),) = shell_commands(output)
            job = yaml.safe_load(manifest)["spec"]["replicatedJobs"][0]["template"]["spec"]
            (container,) = job["template"]["spec"]["containers"]
            return train_part(container["command"])
        return None

    def train(self, argv: list[str]) -> None:
        workdir = argv[argv.index("--workdir") + 1]
        config = argv[argv.index("--config") + 1]
        overrides = [w for w in argv if w.startswith("--config.")]
        if workdir in self.trained or not self.execute:
            # The same run on other hardware (or a check only): its config and overrides
            # must still resolve, which `attnmt params` does without training.
            assert main(["params", "--config", config, *overrides, *TINY]) == 0
            self.ran.append("params")
            return
        variant = re.search(r":variant=(\w+)", config).group(1)
        steps = AVERAGED[variant] + EXTRA_STEPS
        assert main([*argv, *TINY, f"--config.train.num_steps={steps}"]) == 0, argv
        self.trained[workdir] = argv
        self.ran.append("train")

    def attnmt(self, argv: list[str]) -> None:
        if not self.execute:
            return
        extra = FAST_DECODE if argv[0] == "evaluate" else []
        assert main([*argv, *extra]) == 0, argv
        self.ran.append(argv[0])


def saved_steps(checkpoints: Path) -> list[int]:
    """The finished steps of a checkpoints folder: Orbax names a finished step by its number
    (an unfinished save's folder has a suffix)."""
    return sorted(int(path.name) for path in checkpoints.iterdir() if path.name.isdigit())


class ParamsReader:
    """Path -> array of the parameters in a step folder, read with Orbax's own checkpointer
    (not attnmt's manager or averaging code). The tree is read once, from the first step
    asked for: the steps of one run share it."""

    def __init__(self) -> None:
        self.checkpointer = ocp.PyTreeCheckpointer()
        self.args: ocp.args.PyTreeRestore | None = None

    def __call__(self, step_dir: Path) -> dict[str, np.ndarray]:
        if self.args is None:
            tree = self.checkpointer.metadata(step_dir / "state").item_metadata.tree
            params = {"params": tree["params"]}
            as_numpy = lambda _: ocp.RestoreArgs(restore_type=np.ndarray)  # noqa: E731
            self.args = ocp.args.PyTreeRestore(
                item=params,
                restore_args=jax.tree_util.tree_map(as_numpy, params),
                partial_restore=True,  # the parameters only, not the optimizer state
            )
        state = self.checkpointer.restore(step_dir / "state", args=self.args)
        leaves = jax.tree_util.tree_flatten_with_path(state["params"])[0]
        return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def ulps_apart(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of float32 spacing at `got`."""
    return np.abs(got.astype(np.float64) - want) / np.spacing(np.abs(got)).astype(np.float64)


def assert_average_of_last(run: Path, last: int, trained: int, keep: int = 20) -> None:
    """`run/average-last<last>` holds the float64 mean of the newest `last` checkpoints."""
    steps = saved_steps(run / "checkpoints")
    assert steps == list(range(max(1, trained - keep + 1), trained + 1)), steps  # the schedule's
    averaged_dir = run / f"average-last{last}" / "checkpoints"
    assert saved_steps(averaged_dir) == [trained]  # numbered as the newest averaged step
    read = ParamsReader()
    got = read(averaged_dir / str(trained))
    windows = [w for w in (last - 1, last, last + 1) if w <= len(steps)]
    params = {s: read(run / "checkpoints" / str(s)) for s in steps[-max(windows) :]}
    assert all(p.keys() == got.keys() for p in params.values())

    def mean(window: int) -> dict[str, np.ndarray]:
        chosen = [params[s] for s in steps[-window:]]
        return {n: np.mean([p[n].astype(np.float64) for p in chosen], axis=0) for n in got}

    # The float64 mean rounded to float32 is within half a float32 spacing of it; the code's
    # float64 sum in another order moves it by ~1e-15 relative, so at most 1 spacing apart.
    for name, value in mean(last).items():
        assert got[name].dtype == np.float32, name
        assert ulps_apart(got[name], value).max() <= 1, name
    # And the check can tell a window of one checkpoint more or fewer (when there is one).
    for window in windows:
        if window != last:
            apart = np.concatenate([ulps_apart(got[n], v).ravel() for n, v in mean(window).items()])
            assert np.mean(apart > 1) > 0.5, (window, np.mean(apart > 1))


@pytest.fixture
def compilation_cache(tmp_path):
    """A persistent compilation cache while the test runs: the programs its commands share
    (each run's search for the test BLEU and for the average's; the two runs' parameter
    initialisation) compile once. JAX's previous settings are back afterwards."""
    from jax._src import compilation_cache

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    saved = {name: getattr(jax.config, name) for name in names}
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        for name, value in saved.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


@pytest.mark.slow
def test_the_documented_wmt14_recipe_runs_on_mock_data(tmp_path, capsys, compilation_cache):
    bucket = str(tmp_path / "bucket")
    recipe = Recipe(bucket, execute=True)
    with tfds.testing.mock_data(num_examples=SENTENCES):
        for line in recipe_lines(DOC.read_text()):
            recipe.run(line)
    assert recipe.variables["PAIR"] == "ende"
    assert recipe.ran.count("train") == 2  # base and big; the GKE big resolves as params
    assert recipe.ran.count("average") == 2 and recipe.ran.count("evaluate") == 2
    assert {"tpu_vm create", "tpu_vm install", "tpu_vm run", "gke", "image"} <= set(recipe.ran)
    runs = Path(bucket) / "runs"
    # The averages the paper used, of the last K checkpoints the schedule kept.
    for variant, last in AVERAGED.items():
        assert_average_of_last(runs / f"ende_{variant}", last, last + EXTRA_STEPS)
    for run, last in (("ende_base", 5), ("ende_big", 20)):
        (decode,) = (runs / run / "decodes").glob(f"test-*avg{last}*")
        assert (
            len(decode.read_text(encoding="utf-8").split("\n")[:-1]) == SENTENCES
        )  # every sentence
    out = capsys.readouterr().out
    # Each `attnmt train` ends with its newest checkpoint's test BLEU (train.test_at_end),
    # each `attnmt evaluate` prints the average's: four score blocks.
    assert out.count("sacreBLEU") == 4 and out.count("tokenized BLEU") == 4


def test_the_recipe_resolves_for_en_fr_too(tmp_path):
    """PAIR=enfr: every launcher line renders and every training config resolves."""
    recipe = Recipe(str(tmp_path), execute=False, pair="enfr")
    with tfds.testing.mock_data(num_examples=4):
        for line in recipe_lines(DOC.read_text()):
            recipe.run(line)
    assert recipe.ran.count("params") == 3  # base, big on TPU, big on GKE


def _pod_cost():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import pod_cost
    finally:
        sys.path.remove(str(REPO / "bench"))
    return pod_cost


def test_pod_cost_estimate_matches_hand_arithmetic():
    pod_cost = _pod_cost()
    hardware = pod_cost.Slice(chips=16, peak_tflops=275.0, price_per_chip_hour=3.22, note="")
    result = pod_cost.estimate(1e18, 2, hardware, mfu=0.3, price=None)
    hours = 2e18 / (16 * 275e12 * 0.3) / 3600  # 0.1263 h
    assert result["hours"] == pytest.approx(hours)
    assert result["cost"] == pytest.approx(hours * 16 * 3.22)
    assert pod_cost.estimate(1e18, 2, hardware, 0.3, price=1.0)["cost"] == pytest.approx(hours * 16)


def test_pod_cost_update_flops_is_six_flops_per_parameter_and_token():
    # Rule of thumb for a Transformer update: 6 FLOPs per weight a token passes through
    # (2 forward, 4 backward), source tokens through the encoder, target tokens through the
    # decoder and the tied output projection; attention adds about 1 % at 28 tokens.
    pod_cost = _pod_cost()
    import common  # bench/common.py, imported by pod_cost

    experiment = common.load_experiment("configs/wmt14_ende.py:variant=base")
    d, d_ff, layers, vocab = 512, 2048, 6, 37_000
    encoder_layer = 4 * d * d + 2 * d * d_ff
    decoder_layer = 8 * d * d + 2 * d * d_ff
    tokens = 25_000
    rule = 6 * tokens * (layers * encoder_layer + layers * decoder_layer + vocab * d)
    flops = pod_cost.update_flops(experiment, mean_length=28.0)
    assert 1.0 < flops / rule < 1.03
