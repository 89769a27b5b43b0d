"""The README's Python examples run as pasted."""
import os
import re

import torch

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def test_python_blocks_in_readme_run():
    text = open(README, encoding="utf-8").read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README has no python example"
    names: dict = {}
    for block in blocks:
        namespace: dict = {}
        exec(compile(block, "README.md", "exec"), namespace)
        names.update(namespace)
    # "The controller in one screen" built a controller and took one update.
    controller = names["controller"]
    assert isinstance(controller.alpha, torch.Tensor) and controller.alpha.item() > 0
    assert names["logits"].grad is not None  # the loss reached the policy
