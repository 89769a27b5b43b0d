"""``docs/sb3.md``'s example runs as pasted and the controller drives SB3."""

import pathlib
import re
import tempfile
import warnings

import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("gymnasium")


DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "sb3.md"


@pytest.mark.slow
def test_the_example_runs_and_drives_ent_coef(capsys, one_thread):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 2
    ns: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(blocks[0], str(DOC), "exec"), ns)
    assert [str(w.message) for w in caught] == []
    target = ns["callback"].controller.target_entropy  # reads the progress: before the reset
    out = capsys.readouterr().out
    assert "PPO: ent_coef" in out and "SAC: ent_coef" in out
    assert ns["ppo"].ent_coef > 2 * 0.001  # the PID acted on PPO's falling entropy
    callback, model = ns["callback"], ns["model"]  # the SAC run's
    assert float(model.ent_coef_tensor) == pytest.approx(float(callback.controller.alpha))
    assert callback.num_updates == 200  # 300 steps, learning_starts=100
    # The scheduled target followed SB3's progress to the end.
    assert target == pytest.approx(-1.5, abs=0.01)


@pytest.mark.slow
def test_the_save_and_load_example_continues_the_saved_controller(
    capsys, one_thread, tmp_path, monkeypatch
):
    """It saves to the system's temp dir (``tempfile``; here ``tmp_path``), no warning."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ns: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(blocks[1], str(DOC), "exec"), ns)
    assert [str(w.message) for w in caught] == []
    out = capsys.readouterr().out.strip()
    assert out == "updates before the save 4, after the load 6"
    assert out in " ".join(DOC.read_text(encoding="utf-8").split())
    assert [p.name for p in tmp_path.iterdir()] == ["ppo_cartpole_entropy.zip"]


def test_gin_binds_the_callbacks_controller_arguments():
    import gin

    from alf_entropy.integrations.sb3 import EntropyControllerCallback

    gin.parse_config(
        "EntropyControllerCallback.target_entropy = 0.4\nEntropyControllerCallback.batch_size = 128"
    )
    callback = EntropyControllerCallback()
    assert callback._controller_kwargs == {"target_entropy": 0.4}
    assert callback._batch_size == 128
