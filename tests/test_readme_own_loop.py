"""``docs/own_loop.md``'s examples (the controller in your own loop) run as pasted
and move alpha."""

import os
import re

import torch

DOC = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "own_loop.md"
)


def _blocks():
    with open(DOC, encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def test_ppo_and_sac_snippets_run_and_advance_the_controller(capsys):
    torch.set_num_threads(1)
    ppo, sac = _blocks()
    ns: dict = {}
    exec(compile(ppo, "docs/own_loop.md (PPO)", "exec"), ns)
    controller = ns["controller"]
    # Two rollouts, one update each: still estimating max_entropy (window 2 -> stage -2).
    assert controller.stage.item() == -2 and controller.max_entropy.item() > 0
    assert controller.avg_entropy.item() > 0.5  # CartPole's 2 actions start near log 2
    assert controller.alpha.item() != 0.01  # the init stage moved it
    ns = {}
    exec(compile(sac, "docs/own_loop.md (SAC)", "exec"), ns)
    controller = ns["controller"]
    assert controller.stage.item() in (0, 1)  # skip_free_stage: adjusting from the start
    assert controller.alpha.item() != 0.1  # the actor updates moved it
    # Each prints its stage and its entropy against the target.
    ppo_line, sac_line = capsys.readouterr().out.strip().splitlines()[-2:]
    assert re.fullmatch(r"PPO: stage -2, entropy [\d.]+ vs target 0.6, alpha [\d.e-]+", ppo_line)
    assert re.fullmatch(r"SAC: stage [01], entropy -?[\d.]+ vs target -1, alpha [\d.e-]+", sac_line)
