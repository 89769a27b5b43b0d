"""docs/torchrl.md and docs/tianshou.md run as pasted (.ci/run runs this file in a venv with
both clients, outside tests/test_readme.py's environment): without a warning, printing the
page's line alone, saving to the system's temp dir (``tempfile``), not a Unix path."""

import tempfile
import warnings

import pytest
import torch

from tests.test_readme import python_blocks


def _run(page: str, tmp_path, monkeypatch) -> dict:
    """The page's blocks, run with every warning recorded: none may be raised (the pages pass
    the arguments that avoid them); the temp dir is ``tmp_path``."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    names: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, block in enumerate(python_blocks(page)):
            exec(compile(block, f"{page} (python block {i + 1})", "exec"), names)
    assert [str(w.message) for w in caught] == []
    return names


def test_the_torchrl_page_runs(one_thread, capsys, tmp_path, monkeypatch):
    pytest.importorskip("torchrl", reason="TorchRL is not installed (pip install -e '.[torchrl]')")
    import torchrl.collectors  # noqa: F401  (its own import-time deprecations: pytest.ini)

    names = _run("docs/torchrl.md", tmp_path, monkeypatch)
    controller, loss_module = names["alpha_step"].controller, names["loss_module"]
    assert names["loss_td"]["alpha"] != 1.0  # the controller moved the loss's alpha
    assert float(loss_module.log_alpha) == float(controller.log_alpha)
    assert "alpha_controller.driver.log_alpha" in loss_module.state_dict()
    *others, line = capsys.readouterr().out.splitlines()
    assert "(target -0.92)" in line  # Pendulum's default, in env units
    assert all("[torchrl][INFO]" in other for other in others)  # its storage's log, no warning
    saved = torch.load(tmp_path / "alf_entropy_torchrl_sac.pt", weights_only=True)
    assert float(saved["alpha_controller.driver.log_alpha"]) == float(controller.log_alpha)


def test_the_tianshou_page_runs(one_thread, capsys, tmp_path, monkeypatch):
    pytest.importorskip(
        "tianshou", reason="Tianshou is not installed (pip install -e '.[tianshou]')"
    )
    names = _run("docs/tianshou.md", tmp_path, monkeypatch)
    algorithm, alpha = names["algorithm"], names["alpha"]
    assert algorithm.alpha is alpha and alpha.value < 1.0  # SAC stepped the controller
    assert "alpha.controller.driver.log_alpha" in algorithm.state_dict()
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "(squashed [-1, 1] units)" in out  # no trainer's lines
    saved = torch.load(tmp_path / "alf_entropy_tianshou_sac.pt", weights_only=True)
    assert float(saved["alpha.controller.driver.log_alpha"]) == float(alpha.controller.log_alpha)
