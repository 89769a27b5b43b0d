"""The Python examples of the README and of every docs page run as pasted.

Each file's ```python blocks run in order in one namespace (a page may build on
its earlier blocks).  A block fenced as ```{.python .no-run} is shown (highlighted
as Python by mkdocs' superfences), not run: keep those for what needs CUDA,
torchrun or a long training.  Pages whose examples a
dedicated test runs (and checks more closely) are listed in DEDICATED.
"""

import json
import pathlib
import re

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEDICATED = {
    "docs/callbacks.md": "tests/trainers/test_callbacks.py",
    "docs/own_loop.md": "tests/test_readme_own_loop.py",
    "docs/sb3.md": "tests/integrations/test_sb3_docs.py",
    "docs/llm_rl.md": "tests/integrations/test_trl_docs.py",
    "docs/torchrl.md": "tests/integrations/test_clients_docs.py",
    "docs/tianshou.md": "tests/integrations/test_clients_docs.py",
    "docs/alf.md": "tests/integrations/test_alf.py",  # in ALF's venv
}
PAGES = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))


def python_blocks(path):
    """The runnable ```python blocks of ``path`` (not those fenced ```{.python .no-run})."""
    text = (ROOT / path).read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def _run(path):
    """Run the page's blocks in one namespace (the caller uses the ``one_thread`` fixture)."""
    names: dict = {}
    for i, block in enumerate(python_blocks(path)):
        exec(compile(block, f"{path} (python block {i + 1})", "exec"), names)
    return names


@pytest.mark.parametrize("path", [p for p in PAGES if p not in DEDICATED and python_blocks(p)])
def test_python_blocks_run(path, one_thread):
    _run(path)


def test_dedicated_tests_exist_and_read_their_pages():
    for page, test in DEDICATED.items():
        assert python_blocks(page), f"{page} has no python example"
        assert page in (ROOT / test).read_text(encoding="utf-8") or pathlib.Path(page).name in (
            ROOT / test
        ).read_text(encoding="utf-8")


def blocks(path):
    """``(language, text, reason)`` of every fenced block of ``path``; ``reason`` is what the
    ``<!-- not run: reason -->`` line before the fence says, else None."""
    lines = (ROOT / path).read_text(encoding="utf-8").split("\n")
    found, i = [], 0
    while i < len(lines):
        fence = re.match(r"^```(.*)$", lines[i])
        if not fence:
            i += 1
            continue
        end = lines.index("```", i + 1)
        reason = re.match(r"^<!-- not run: (.+) -->$", lines[i - 1]) if i else None
        found.append(
            (fence.group(1), "\n".join(lines[i + 1 : end]) + "\n", reason and reason.group(1))
        )
        i = end + 1
    return found


# Blocks another test runs: python on DEDICATED pages, gin of ALF's (ALF's venv), verl's.
RUN_ELSEWHERE = {("docs/alf.md", "gin"): "tests/integrations/test_alf.py"}
RUN_HERE = ("python", "gin", "json", "{.python .verl}")


@pytest.mark.parametrize("path", PAGES)
def test_every_block_runs_in_the_suite_or_says_why_not(path):
    """Each fenced block is Python, gin or a sweep spec that the suite runs, or it is marked
    ``<!-- not run: reason -->`` (a shell command that installs or trains for minutes, an
    output, a diff)."""
    for language, text, reason in blocks(path):
        assert language in RUN_HERE or reason, f"{path}: a ```{language} block says not why"
        assert not (language == "python" and reason is None and "no-run" in language)


@pytest.mark.slow
@pytest.mark.parametrize(
    "path",
    [
        p
        for p in PAGES
        if any(lang == "gin" and not reason for lang, _, reason in blocks(p))
        and (p, "gin") not in RUN_ELSEWHERE
    ],
)
def test_gin_blocks_build_their_run(path, tmp_path, one_thread):
    """Each gin block, on the shipped config it speaks of (its own ``include``, else SAC's for
    SAC or off-policy bindings, else the main job), builds its run: every binding is taken."""
    import gin

    from alf_entropy.config.loading import configured_trainer, parse_gin_config

    for k, (language, text, reason) in enumerate(blocks(path)):
        if language != "gin" or reason:
            continue
        base = "sac_pendulum.gin" if re.search(r"Sac|OffPolicy", text) else "ppo_cartpole.gin"
        config = tmp_path / f"block{k}.gin"
        config.write_text(text if "include" in text else f"include '{base}'\n{text}")
        gin.clear_config()
        parse_gin_config([str(config)], [])
        if "." not in text.replace("alf_entropy.config", ""):  # an import alone
            continue
        trainer = configured_trainer()(str(tmp_path / f"run{k}"), device="cpu")
        trainer.close()
    gin.clear_config()


def test_the_sweep_spec_of_the_docs_is_valid():
    from alf_entropy.experiments.sweep_spec import check_spec

    (spec,) = [json.loads(text) for p in PAGES for lang, text, _ in blocks(p) if lang == "json"]
    assert len(check_spec(spec)["seeds"]) == 3


def test_every_python_fence_is_run_or_marked_no_run():
    """No Python block escapes the test by its spelling, and exceptions stay few."""
    no_run = 0
    for path in PAGES:
        for fence in re.findall(r"^\s*```(.*)$", (ROOT / path).read_text(encoding="utf-8"), re.M):
            if "py" in fence.lower():
                # {.python .verl}: run by tests/integrations/test_verl_docs.py in verl's venv
                assert fence in ("python", "{.python .no-run}", "{.python .verl}"), (
                    f"{path}: ```{fence}"
                )
                no_run += fence == "{.python .no-run}"
    assert no_run <= 3


def test_the_controller_in_one_screen(one_thread, capsys):
    names = _run("README.md")
    # What it prints is what the README says it prints, in words.
    out = capsys.readouterr().out
    assert "alpha 0.100; stage -3: estimating max_entropy (1 more update)" in out
    assert out.strip() in (ROOT / "README.md").read_text(encoding="utf-8").replace("\n", " ")
    # "The controller in one screen" built a controller and took one update.
    controller = names["controller"]
    assert isinstance(controller.alpha, torch.Tensor) and controller.alpha.item() > 0
    assert names["logits"].grad is not None  # the loss reached the policy
