"""The experiment tools sit on top of the library: its core never imports them."""

import ast
import pathlib

import alf_entropy

CORE = (
    "trainers",
    "algorithms",
    "controllers",
    "utils",
    "networks",
    "environments",
    "integrations",
)


def _imports(path: pathlib.Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


def test_the_core_never_imports_the_experiment_tools():
    root = pathlib.Path(alf_entropy.__file__).parent
    files = [f for room in CORE for f in (root / room).rglob("*.py")]
    files += list(root.glob("*.py"))
    assert len(files) > 40
    offenders = {
        str(f.relative_to(root)): name
        for f in files
        for name in _imports(f)
        if name.startswith("alf_entropy.experiments")
    }
    assert offenders == {}


def test_the_commands_are_thin_entry_points_to_the_tools():
    from alf_entropy.bin import report as report_cli
    from alf_entropy.bin import sweep as sweep_cli
    from alf_entropy.experiments import report, sweep

    assert report_cli.main is report.main and sweep_cli.main is sweep.main
