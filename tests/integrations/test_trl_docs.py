"""docs/llm_rl.md runs as pasted (it needs TRL, so it is not in tests/test_readme.py's loop)."""

import pathlib

import pytest

pytest.importorskip("trl", reason="TRL is not installed (pip install -e '.[trl]')")

from tests.test_readme import python_blocks  # noqa: E402

PAGE = "docs/llm_rl.md"


def test_llm_rl_page_runs(one_thread, capsys):
    names: dict = {}
    for i, block in enumerate(python_blocks(PAGE)):
        exec(compile(block, f"{PAGE} (python block {i + 1})", "exec"), names)
    assert names["uncontrolled"][-1] < 0.5
    assert pathlib.Path(PAGE).name == "llm_rl.md"
    # One line (no log dict per step), and it prints the number it asserts.
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.endswith(f"{names['late']:.3f} with a target of 2.5")
