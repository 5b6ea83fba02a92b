"""README's "Running on pods" commands, as written.

Every launcher line of the marked block runs with `--dry-run` (so a renamed flag or a
launcher that refuses the line fails here), and every `--config` it names is loaded with
the line's `--config.*` overrides, as `attnmt train` will load it on the workers (so a
config key that does not exist fails here, not on a paid slice). The lines that need a
cloud or a cluster (`kubectl`, `uv` on a shared filesystem, `attnmt report` of a bucket)
are recognised and not run; any other kind of line fails the test, so the block cannot
grow commands nobody checks.
"""

from __future__ import annotations

import re
import shlex

from attnmt.config import load_experiment
from attnmt.config.overrides import split_overrides
from tests.launch.helpers import REPO, launch

BEGIN, END = "<!-- pod-commands: begin", "<!-- pod-commands: end -->"
NOT_RUN_HERE = ("kubectl", "uv", "attnmt")  # a cluster, a shared filesystem, a bucket


def block_lines() -> list[str]:
    """The block's logical lines: continuations joined, `&&` chains split, comments and
    blank lines dropped."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    body = text[text.index(BEGIN) : text.index(END)].split("```bash\n", 1)[1]
    body = body.rsplit("```", 1)[0].replace("\\\n", " ")
    lines = []
    for raw in body.splitlines():
        line = raw.split(" # ", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        lines += [part.strip() for part in line.split("&&") if part.strip()]
    return lines


def expand(line: str, variables: dict[str, str]) -> str:
    def value(match: re.Match) -> str:
        name = match.group(1)
        assert name in variables, f"README uses ${name} before setting it: {line}"
        return variables[name]

    return re.sub(r"\$(\w+)", value, line)


def configs_named(words: list[str]) -> list[tuple[str, dict[str, str]]]:
    """(config spec, its overrides) of a launcher line that names a config."""
    rest, overrides = split_overrides(words)
    specs = [rest[i + 1] for i, word in enumerate(rest[:-1]) if word == "--config"]
    return [(spec, overrides) for spec in specs]


def test_every_pod_command_of_the_readme_runs_as_written():
    variables: dict[str, str] = {"JOBSET_VERSION": "v0.0.0"}
    launched, skipped = [], []
    for line in block_lines():
        assignment = re.fullmatch(r"([A-Z_]+)=(\S+)", line)
        if assignment:
            variables[assignment.group(1)] = assignment.group(2)
            continue
        words = shlex.split(expand(line, variables))
        if words[0] in NOT_RUN_HERE:
            skipped.append(words[0])
            continue
        assert words[0] == "python" and words[1].startswith("launch/"), line
        script = words[1].removeprefix("launch/").removesuffix(".py")
        result = launch(script, *words[2:], "--dry-run")
        assert result.returncode == 0, f"{line}\n{result.stderr}"
        assert result.stdout.strip(), f"{line} printed nothing to run"
        for spec, overrides in configs_named(words[2:]):
            load_experiment(spec, overrides)
        launched.append(script)
    # The block shows every launcher and the sweep; a change that drops one shows here.
    assert {"tpu_vm", "image", "gke", "slurm", "local", "sweep"} <= set(launched), launched
    assert launched.count("tpu_vm") >= 5 and launched.count("gke") == 2, launched
    assert sorted(set(skipped)) == ["attnmt", "kubectl", "uv"], skipped


def test_the_block_reader_joins_continuations_and_keeps_only_commands():
    assert block_lines()[0].startswith("BUCKET=")
    assert not any(line.startswith("#") or line.endswith("\\") for line in block_lines())
