"""The controller without the trainers' dependencies (issue 20, part 1).

The controller (everything a plain PyTorch loop imports) must work with any
gymnasium from 0.29 (CleanRL's pin) or none; the trainers need the ``train``
extra (``gymnasium>=1.1``, ``tqdm``) and say so in one line.  ``.ci/run`` also
runs this file in a venv with gymnasium 0.29.1.
"""

import os
import pathlib
import subprocess
import sys

import pytest

from alf_entropy.utils import requirements
from alf_entropy.utils.requirements import MissingDependencyError, require_train_extra

REPO = pathlib.Path(__file__).resolve().parents[1]


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in sys.path if p]))
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# ``sys.modules[name] = None`` is how Python spells "not installed": importing it
# raises ModuleNotFoundError and importlib.util.find_spec returns None.
_WITHOUT_GYMNASIUM = "import sys\nsys.modules['gymnasium'] = None\nsys.modules['tqdm'] = None\n"


@pytest.mark.slow
def test_the_controller_works_without_gymnasium():
    code = _WITHOUT_GYMNASIUM + (
        "import torch\n"
        "import alf_entropy as ae\n"
        "from alf_entropy import *  # every public name imports without gymnasium\n"
        "spec = ae.BoundedTensorSpec((), torch.int64, 0, 3)\n"
        "for cls in (ae.EntropyTargetAlgorithm, ae.SGDEntropyTargetAlgorithm,\n"
        "            ae.FixedEntropyCoefficient):\n"
        "    c = cls(spec, target_entropy=0.5)\n"
        "    for _ in range(5):\n"
        "        c.adjust_alpha(0.2)\n"
        "    c.entropy_loss(torch.full((8,), 0.2)).loss.sum()\n"
        "nested = ae.NestedEntropyTargetAlgorithm({'a': spec, 'b': spec})\n"
        "nested.adjust_alpha({'a': torch.tensor(0.1), 'b': torch.tensor(0.1)})\n"
        "sched = ae.LinearScheduler('percent', [(0, 0.6), (1.0, 0.1)])\n"
        "ae.update_progress('percent', 0.5)\n"
        "c = ae.EntropyTargetAlgorithm(spec, target_entropy=sched)\n"
        "print('TARGET', round(c.target_entropy, 3))\n"
        "try:\n"
        "    ae.EntropyTargetAlgorithm.from_space(object())\n"
        "except ImportError as e:\n"
        "    print('FROM_SPACE', e)\n"
        "try:\n"
        "    import alf_entropy.trainers\n"
        "except ImportError as e:\n"
        "    print('TRAINERS', type(e).__name__, e)\n"
        "import gin, alf_entropy.config.configurables\n"
        "gin.parse_config('EntropyTargetAlgorithm.max_alpha = 20.0')\n"
        "print('GIN_MAX_ALPHA', ae.EntropyTargetAlgorithm(spec).settings['max_alpha'])\n"
        "try:\n"
        "    gin.parse_config('OnPolicyTrainer.seed = 1')\n"
        "except ValueError as e:\n"
        "    print('GIN_TRAINER', e)\n"
        "print('GYM_LOADED', any(m.startswith(('gymnasium', 'tqdm'))\n"
        "                        for m in sys.modules if sys.modules[m]))\n"
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "TARGET 0.35" in out, out
    assert "FROM_SPACE" in out and "pip install gymnasium" in out, out
    assert "TRAINERS MissingDependencyError" in out, out
    assert 'pip install -e ".[train]"' in out, out
    assert "not installed" in out, out
    assert "GIN_MAX_ALPHA 20.0" in out, out
    assert "GIN_TRAINER No configurable matching 'OnPolicyTrainer'" in out, out
    assert "GYM_LOADED False" in out, out


@pytest.mark.slow
def test_import_alf_entropy_is_light():
    proc = _python(
        "import sys, alf_entropy\n"
        "print(sorted(m for m in ('torch', 'gin', 'gymnasium',\n"
        "                         'alf_entropy.algorithms') if m in sys.modules))"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


@pytest.mark.parametrize(
    "found, problem",
    [
        (None, "gymnasium>=1.1, which is not installed"),
        ("0.29.1", "gymnasium>=1.1 (AutoresetMode), found gymnasium 0.29.1"),
        ("1.0.0", "found gymnasium 1.0.0"),
    ],
)
def test_require_train_extra_names_what_to_install(monkeypatch, found, problem):
    monkeypatch.setattr(requirements, "gymnasium_version", lambda: found)
    with pytest.raises(MissingDependencyError, match=r"pip install -e \"\.\[train\]\"") as info:
        require_train_extra("the trainer")
    assert problem in str(info.value)
    assert isinstance(info.value, ImportError)


@pytest.mark.parametrize("version", ["1.1.0", "1.4.0", "2.0.0rc1"])
def test_require_train_extra_accepts_new_gymnasium(monkeypatch, version):
    monkeypatch.setattr(requirements, "gymnasium_version", lambda: version)
    require_train_extra()


@pytest.mark.slow
def test_cli_with_old_gymnasium_prints_one_line_and_exits_2(tmp_path):
    # Simulated (this interpreter's gymnasium may be new): the check reads the version.
    code = (
        "import sys\n"
        "import alf_entropy.utils.requirements as r\n"
        "r.gymnasium_version = lambda: '0.29.1'\n"
        "from alf_entropy.bin.train import main\n"
        "sys.argv = ['alf-entropy-train', '--root_dir', sys.argv[1]]\n"
        "main()\n"
    )
    proc = _python(code, str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("alf-entropy-train: error: the trainer needs gymnasium>=1.1"), lines
    assert 'pip install -e ".[train]"' in lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.skipif(
    requirements.gymnasium_version() is None
    or requirements.version_tuple(requirements.gymnasium_version()) >= (1, 1),
    reason="needs a gymnasium older than 1.1 installed (.ci/run's 0.29.1 venv)",
)
def test_cli_with_the_installed_old_gymnasium_exits_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "alf_entropy.bin.train", "--root_dir", str(tmp_path / "run")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert f"found gymnasium {requirements.gymnasium_version()}" in proc.stderr


def test_from_space_with_the_installed_gymnasium():
    gym = pytest.importorskip("gymnasium")
    import torch

    import alf_entropy as ae

    c = ae.EntropyTargetAlgorithm.from_space(gym.spaces.Discrete(4, start=1), target_entropy=0.5)
    assert c.action_spec == ae.BoundedTensorSpec((), torch.int64, 1, 4)
    box = ae.SGDEntropyTargetAlgorithm.from_space(gym.spaces.Box(-2.0, 2.0, (2,)))
    assert box.action_spec.shape == (2,) and box.action_spec.dtype == torch.float32
    md = ae.FixedEntropyCoefficient.from_space(gym.spaces.MultiDiscrete([3, 2]))
    assert md.action_spec.maximum.tolist() == [2, 1]


def setup_kwargs() -> dict:
    """The literal keyword arguments of setup.py's ``setup(...)`` call."""
    import ast

    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    call = next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "setup"
    )
    return {
        k.arg: ast.literal_eval(k.value)
        for k in call.keywords
        if k.arg in ("install_requires", "extras_require")
    }


def test_setup_keeps_gymnasium_out_of_the_core_and_agrees_on_the_minimum():
    kwargs = setup_kwargs()
    core = " ".join(kwargs["install_requires"])
    assert "gymnasium" not in core and "tqdm" not in core, core
    train = kwargs["extras_require"]["train"]
    minimum = ".".join(map(str, requirements.MIN_GYMNASIUM))
    assert f"gymnasium>={minimum}" in train and "tqdm" in train, train
    assert any(r.startswith("stable-baselines3") for r in kwargs["extras_require"]["sb3"])
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert f"MIN_GYM={minimum}" in ci or f"MIN_GYM={minimum}.0" in ci
    assert "CLEANRL_GYM=0.29.1" in ci and "train" in ci and "sb3" in ci


def test_report_without_matplotlib_writes_the_tables_and_one_line_naming_the_extra(
    tmp_path, monkeypatch, capsys
):
    """The metrics table needs no figures: without matplotlib it is written and printed,
    and one line says the figures need the extra (exit 0)."""
    from torch.utils.tensorboard import SummaryWriter

    from alf_entropy.experiments import report

    writer = SummaryWriter(str(tmp_path / "run" / "train"))
    for step, entropy in enumerate([0.69, 0.6, 0.5]):
        for tag, value in (
            ("entropy", entropy),
            ("target_entropy", 0.5),
            ("env_steps", 100.0 * (step + 1)),
        ):
            writer.add_scalar(tag, value, step)
    writer.close()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed
    assert report.main([str(tmp_path / "run")]) == 0
    out, err = capsys.readouterr()
    assert "| run | run | – | 300 | 300 |" in out  # the table: env steps, tracking from 300
    assert sorted(os.listdir(tmp_path / "run" / "report")) == ["metrics.csv", "metrics.md"]
    assert err.splitlines() == [
        f"alf-entropy-report: wrote the metrics to {tmp_path / 'run' / 'report'}, no figures: "
        "the report's figures need matplotlib, which is not installed: "
        'pip install -e ".[report]"'
    ]
