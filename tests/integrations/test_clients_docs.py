"""docs/torchrl.md and docs/tianshou.md run as pasted (.ci/run runs this file in a venv with
both clients, outside tests/test_readme.py's environment)."""
import pytest

from tests.test_readme import python_blocks


def _run(page: str) -> dict:
    names: dict = {}
    for i, block in enumerate(python_blocks(page)):
        exec(compile(block, f"{page} (python block {i + 1})", "exec"), names)
    return names


def test_the_torchrl_page_runs(one_thread, capsys):
    pytest.importorskip("torchrl", reason="TorchRL is not installed (pip install -e '.[torchrl]')")
    names = _run("docs/torchrl.md")
    controller, loss_module = names["alpha_step"].controller, names["loss_module"]
    assert names["loss_td"]["alpha"] != 1.0  # the controller moved the loss's alpha
    assert float(loss_module.log_alpha) == float(controller.log_alpha)
    assert "alpha_controller.driver.log_alpha" in loss_module.state_dict()
    assert "(target -0.92)" in capsys.readouterr().out  # Pendulum's default, in env units


def test_the_tianshou_page_runs(one_thread, capsys):
    pytest.importorskip("tianshou", reason="Tianshou is not installed (pip install -e "
                        "'.[tianshou]')")
    names = _run("docs/tianshou.md")
    algorithm, alpha = names["algorithm"], names["alpha"]
    assert algorithm.alpha is alpha and alpha.value < 1.0  # SAC stepped the controller
    assert "alpha.controller.driver.log_alpha" in algorithm.state_dict()
    assert "(squashed [-1, 1] units)" in capsys.readouterr().out
