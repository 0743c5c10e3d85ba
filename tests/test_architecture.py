"""The package shows the floors, and the facts are defined once: checked on the source itself."""

import ast
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "loopeval"
FLOORS = ["common", "core", "evaluation", "engines", "training", "analysis", "tools", "cli", "model_adapters", "tasks"]
"""Bottom to top: a module may import its own floor and the floors below it, never one above. The
top two are read by lm-eval: its ``looped`` model and the task folder's functions (``tasks/``,
installed as ``loopeval/tasks``)."""


def _floor(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "loopeval" or len(parts) < 2:
        return None
    return FLOORS.index(parts[1]) if parts[1] in FLOORS else None


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    # the top-level folders the wheel ships inside the package: loopeval/tasks, loopeval/model_adapters
    parts = ("loopeval", *rel.parts) if rel.parts[0] in ("tasks", "model_adapters") else rel.parts
    return ".".join(parts[:-1] if rel.name == "__init__" else parts)


def _distribution() -> list[Path]:
    """Every Python file the wheel ships: the package, the top-level folders it links to
    (``loopeval/model_adapters`` is ``model_adapters/``; the wheel follows the link, ``rglob`` does
    not) and the folders pyproject.toml force-includes into it."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    included = list(project["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"])
    included += [str(link.resolve().relative_to(ROOT)) for link in PACKAGE.rglob("*") if link.is_symlink()]
    files = list(PACKAGE.rglob("*.py"))
    for source in included:
        path = ROOT / source
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.suffix == ".py" else []
    return sorted(files)


SOURCES = _distribution()


def test_every_module_lives_on_a_floor():
    loose = sorted(_module(p) for p in SOURCES
                   if _floor(_module(p)) is None and p.name not in ("__init__.py", "__main__.py"))
    assert loose == [], f"modules outside the floor packages: {loose}"
    assert any("model_adapters" in _module(p) for p in SOURCES) and any("tasks" in _module(p) for p in SOURCES)


@pytest.mark.parametrize("path", [p for p in SOURCES if _floor(_module(p)) is not None], ids=lambda p: _module(p))
def test_no_module_imports_a_floor_above_its_own(path):
    own = _floor(_module(path))
    upward = sorted(m for m in _imports(path) if (_floor(m) or 0) > own)
    assert upward == [], f"{_module(path)} (floor {FLOORS[own]}) imports {upward}"


def test_no_import_cycle_between_modules():
    modules = {_module(p): p for p in SOURCES}

    def edges(m, path):
        found = {i for i in _imports(path) if i in modules and i != m}
        # ``from package import submodule`` depends on the submodule, not on the package's __init__
        return {i for i in found if not any(j.startswith(i + ".") for j in found)}

    graph = {m: edges(m, p) for m, p in modules.items()}
    state = {}

    def visit(m, stack):
        state[m] = "open"
        for n in graph[m]:
            if state.get(n) == "open":
                pytest.fail(f"import cycle: {' -> '.join(stack[stack.index(n):] + [n])}")
            if n not in state:
                visit(n, stack + [n])
        state[m] = "done"

    for m in graph:
        if m not in state:
            visit(m, [m])


@pytest.mark.parametrize("module", ["loopeval.tools.study.spec", "loopeval.training.manifest", "loopeval.training.exchange",
                                    "loopeval.training.exit_monitor", "loopeval.core.spec", "loopeval.evaluation.settings",
                                    "loopeval.training.config"])
def test_validating_files_imports_no_torch(module):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_loop_options_reach_every_consumer():
    """Adding a LoopConfig field adds a model arg, a study key and a stored key, without edits."""
    from loopeval.core.spec import LOOP_OPTIONS, LoopConfig
    from loopeval.evaluation.model_args import LoopedArgs
    from loopeval.tools.study.spec import MODEL_KEYS

    assert LOOP_OPTIONS == tuple(f.name for f in fields(LoopConfig))[1:]
    args = {f.name for f in fields(LoopedArgs)}
    assert {"loop", *(f"loop_{o}" for o in LOOP_OPTIONS)} <= args
    assert set(LOOP_OPTIONS) <= set(MODEL_KEYS)
    full = LoopConfig("1:3x2", operator="damped", beta=0.5, mix=1.0, mix_source="embedding")
    assert set(full.to_dict()) == {"loop", *LOOP_OPTIONS}
    assert LoopConfig.from_dict(full.to_dict()) == full


def test_decoding_options_reach_every_consumer():
    from loopeval.evaluation.model_args import LoopedArgs
    from loopeval.evaluation.settings import DECODING_OPTIONS
    from loopeval.evaluation.trace import SHARED

    args = {f.name for f in fields(LoopedArgs)}
    assert set(DECODING_OPTIONS) <= args
    assert set(DECODING_OPTIONS) <= set(SHARED)


def test_statistics_defaults_are_the_papers_and_reach_the_study():
    """A.5: 'Equivalence means a 90% interval within ±2 points'."""
    from loopeval.analysis.stats.options import DEFAULTS, STAT_OPTIONS
    from loopeval.tools.study.spec import STATISTICS_KEYS

    assert (DEFAULTS.margin, 1 - 2 * DEFAULTS.alpha) == (0.02, pytest.approx(0.90))
    assert set(STAT_OPTIONS) <= set(STATISTICS_KEYS)


def test_literal_defaults_are_defined_once():
    """A grep for each default finds its one definition (plus the version in __init__)."""
    literals = {"10_000": 1, "0.02": None, '"search.json"': 1, '"<think>"': 1}
    text = {p: p.read_text() for p in PACKAGE.rglob("*.py")}
    for literal, expected in literals.items():
        where = [str(p.relative_to(PACKAGE)) for p, t in text.items() if literal in t]
        if expected is not None:
            assert len(where) == expected, f"{literal} in {where}"
    assert sum(t.count('"0.1.0"') for t in text.values()) == 1


def test_the_default_operator_is_the_papers_damped_update():
    """D.1: 'damping, not repetition, makes reuse of these layers safe.'"""
    from loopeval.core.spec import DEFAULT_OPERATOR, LoopConfig
    from loopeval.tools.placement.grid import build_grid

    assert DEFAULT_OPERATOR == "damped" and LoopConfig("1:3x2").operator == "damped"
    assert {c.operator for c in build_grid(6, widths=[2], times=[2], betas=[0.0])} == {"damped"}
