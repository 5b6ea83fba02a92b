"""The package's shape holds: inference never imports training, no module imports one that
imports it back (at any depth, lazy imports inside functions included), and no function in
src/ runs over 60 lines."""

import ast
import json
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

INFERENCE_MODULES = [
    "attnmt.workdir",
    "attnmt.decode.translate",
    "attnmt.decode.evaluation",
    "attnmt.decode.beam_search",
    "attnmt.decode.parsing",
    "attnmt.evaluate.bleu",
    "attnmt.evaluate.parse_f1",
    "attnmt.checkpoint.manager",
    "attnmt.checkpoint.average",
    "attnmt.inspection.capture",
    "attnmt.inspection.view",
    "attnmt.inspection.ablation",
    "attnmt.interop.hf_import",
    "attnmt.interop.hf_export",
    "attnmt.metrics",
    # the command line: every subcommand module, as `attnmt translate` loads them
    "attnmt.cli.main",
    "attnmt.cli.arguments",
    "attnmt.cli.translate",
    "attnmt.cli.attention",
    "attnmt.cli.parse",
    "attnmt.cli.interop",
    "attnmt.cli.report",
    "attnmt.cli.train",
]
MAX_FUNCTION_LINES = 60


def test_inference_imports_no_training_code():
    probe = (
        "import importlib, json, sys\n"
        f"for name in {INFERENCE_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('attnmt.'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(INFERENCE_MODULES) <= set(loaded)
    training = sorted(m for m in loaded if m == "attnmt.train" or m.startswith("attnmt.train."))
    assert training == [], training


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Every attnmt module `path` imports, wherever the import statement is."""
    found = set()
    package = _module_name(path).rpartition(".")[0] if path.name != "__init__.py" else None
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(filter(None, [package or _module_name(path), base]))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(name for name in names if name in modules)
    return found


def _import_graph() -> dict[str, set[str]]:
    paths = {_module_name(path): path for path in SRC.joinpath("attnmt").rglob("*.py")}
    modules = set(paths)
    return {name: _imports(path, modules) - {name} for name, path in paths.items()}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _find_cycle(graph) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_one_that_imports_it_back():
    graph = _import_graph()
    assert graph["attnmt.cli.main"] >= {"attnmt.cli.translate", "attnmt.cli.train"}
    cycle = _find_cycle(graph)
    assert cycle is None, " → ".join(cycle)


def test_no_function_in_src_runs_over_60_lines():
    long = []
    for path in sorted(SRC.joinpath("attnmt").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({lines})")
    assert long == [], long


def _layout_entries() -> dict[str, str]:
    """README's Layout block: top-level entry (`config/`, `common.py`) → its text."""
    readme = (SRC.parent / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Layout", 1)[1].split("```", 2)[1]
    entries: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        if line.startswith("  ") and not line.startswith("   "):
            current, _, text = line.strip().partition(" ")
            entries[current] = text
        elif current is not None and line.startswith("   "):
            entries[current] += " " + line.strip()
    return entries


def test_the_readme_layout_names_every_module_where_it_is():
    entries = _layout_entries()
    package = SRC / "attnmt"
    missing = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if relative.name in ("__init__.py", "__main__.py"):
            continue
        if len(relative.parts) == 1:
            found = relative.name in entries
        else:
            found = relative.name in entries.get(f"{relative.parts[0]}/", "").replace(",", " ")
        if not found:
            missing.append(str(relative))
    assert missing == [], f"README's Layout does not list {missing}"
    listed = {name for name in entries if name.endswith(("/", ".py"))}
    on_disk = {p.name + ("/" if p.is_dir() else "") for p in package.iterdir()}
    assert listed <= on_disk, sorted(listed - on_disk)


def test_no_test_module_imports_another_test_module():
    """Shared test code lives in helper modules (tests/helpers.py and the like), never in a
    test module that another one imports (which would also collect its tests twice)."""
    tests = SRC.parent / "tests"
    offending = []
    for path in sorted(tests.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                relative = isinstance(node, ast.ImportFrom) and node.level > 0
                if (relative or name.startswith("tests.")) and name.rsplit(".", 1)[-1].startswith(
                    "test_"
                ):
                    offending.append(f"{path.relative_to(tests)} imports {name}")
    assert offending == [], offending
