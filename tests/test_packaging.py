"""Packaging checks: the gin guard in ``alf_entropy/__init__.py`` and package data."""

import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def _clean_python(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter that skips ``site`` (no .pth imports).

    ``site`` processing can import ``importlib.util`` as a side effect, which
    would hide the gin-config bug the package guards against; the parent's
    ``sys.path`` is passed through ``PYTHONPATH`` instead.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in sys.path if p])
    return subprocess.run(
        [sys.executable, "-S", "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_gin_missing_include_raises_file_error_not_attribute_error():
    code = (
        "import sys\n"
        "print('PRELOADED', 'importlib.util' in sys.modules)\n"
        "import alf_entropy, gin\n"
        "try:\n"
        "    gin.parse_config('include \"does_not_exist.gin\"')\n"
        "except Exception as e:\n"
        "    print('EXC', type(e).__name__, isinstance(e, OSError), str(e).splitlines()[0])\n"
        "else:\n"
        "    print('NO_EXCEPTION')\n"
    )
    proc = _clean_python(code)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    # The check is meaningful only if nothing imported importlib.util before us.
    assert "PRELOADED False" in out, out
    assert "NO_EXCEPTION" not in out
    assert "AttributeError" not in out and "importlib" not in out, out
    assert "EXC" in out and " True " in out, out
    assert "does_not_exist.gin" in out, out


@pytest.mark.slow
def test_gin_configs_are_package_data(tmp_path):
    source_gins = {p.name for p in (REPO / "alf_entropy" / "configs").glob("*.gin")}
    assert source_gins, "alf_entropy/configs holds no .gin files"

    # Build from a copy so the repository gets no build/ or egg-info output.
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(REPO / "alf_entropy", src / "alf_entropy", ignore=ignore)
    for name in ("setup.py", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for optional in ("MANIFEST.in", "pyproject.toml", "setup.cfg"):
        if (REPO / optional).exists():
            shutil.copy2(REPO / optional, src / optional)
    wheel_dir = tmp_path / "wheels"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            ".",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(wheel_dir),
        ],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wheels = list(wheel_dir.glob("alf_entropy-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as zf:
        names = zf.namelist()
    wheel_gins = {
        pathlib.PurePosixPath(n).name
        for n in names
        if n.startswith("alf_entropy/configs/") and n.endswith(".gin")
    }
    assert wheel_gins == source_gins
    assert "alf_entropy/__init__.py" in names


def test_declared_gymnasium_minimum_is_the_one_ci_tests():
    """setup.py's lower bound for gymnasium is the version .ci/run tests."""
    import re

    declared = re.search(r'"gymnasium>=([0-9.]+)"', (REPO / "setup.py").read_text())
    tested = re.search(r"MIN_GYM=([0-9.]+)", (REPO / ".ci" / "run").read_text())
    assert declared and tested, "setup.py or .ci/run lost its gymnasium minimum"
    assert tested.group(1).startswith(declared.group(1)), (declared.group(1), tested.group(1))


def test_declared_torch_floor_is_the_one_the_docs_state_and_ci_pins_one_version():
    """setup.py's torch floor is what the README and the install page say."""
    import re

    declared = re.search(r'"torch>=([0-9.]+)"', (REPO / "setup.py").read_text())
    assert declared, "setup.py lost its torch requirement"
    floor = declared.group(1)
    for page in ("README.md", "docs/index.md"):
        text = (REPO / page).read_text(encoding="utf-8")
        assert f"torch>={floor}" in text, page
        assert not re.search(r"torch>=(?!" + re.escape(floor) + r"\b)[0-9]", text), page
    pinned = re.search(r'"torch==([0-9.]+)"', (REPO / ".ci" / "run").read_text())
    assert pinned, ".ci/run lost its torch pin"
    assert f"torch {pinned.group(1)}" in (REPO / "docs" / "index.md").read_text(encoding="utf-8")
    assert tuple(map(int, pinned.group(1).split("."))) >= tuple(map(int, floor.split(".")))
