"""docs/llm_rl.md's verl section runs as pasted (its blocks are fenced ``{.python .verl}``:
they need verl, which the TRL environment that runs the page's other blocks lacks)."""

import pathlib
import re
import sys
import types

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install -e '.[verl]')")

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "llm_rl.md"


def test_verl_section_runs(monkeypatch, capsys):
    text = PAGE.read_text(encoding="utf-8")
    module_block, check_block = re.findall(r"^```\{\.python \.verl\}\n(.*?)^```", text, re.S | re.M)
    # the first block is the user's my_entropy.py, which the config names
    my_entropy = types.ModuleType("my_entropy")
    exec(compile(module_block, "my_entropy.py", "exec"), my_entropy.__dict__)
    monkeypatch.setitem(sys.modules, "my_entropy", my_entropy)
    names: dict = {}
    exec(compile(check_block, f"{PAGE.name} (verl block 2)", "exec"), names)
    printed = capsys.readouterr().out.strip()
    assert printed in text  # the page shows what the block prints
    assert printed.startswith("actor_rollout_ref.actor.calculate_entropy must be True")
    assert type(names["controller"]).__name__ == "LinearPIDEntropyTargetAlgorithm"
    assert 2.5 <= float(names["controller"].target_entropy) <= 3.0  # the page's schedule
