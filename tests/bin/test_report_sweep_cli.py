"""alf-entropy-report and -sweep: integer counts in tables, a clean Ctrl-C (issue 22, item 7)."""
import math

import pytest

pytest.importorskip("matplotlib")

from alf_entropy.experiments import report  # noqa: E402


def _row(**values):
    row = {c: math.nan for c in report.METRIC_COLUMNS}
    row.update(run="r+seed=0", group="r", seed=0)
    row.update(values)
    return row


def test_env_step_counts_print_as_integers_other_metrics_to_four_digits(tmp_path):
    rows = [_row(env_steps=12288, tracking_from_env_step=12290.0, tracking_rmse=0.0123456,
                 max_alpha_change_x=123456.0)]
    _, md_path = report._write_tables(rows, str(tmp_path))
    table = open(md_path, encoding="utf-8").read()
    cells = [line for line in table.splitlines() if line.startswith("| r+seed=0 |")][0].split(" | ")
    by_column = dict(zip(report.METRIC_COLUMNS, (c.strip("| ") for c in cells)))
    assert by_column["env_steps"] == "12288"
    assert by_column["tracking_from_env_step"] == "12290"
    assert by_column["tracking_rmse"] == "0.01235"
    assert by_column["max_alpha_change_x"] == "1.235e+05"  # a ratio, not a count
    assert by_column["final_return"] == "–"


def test_fmt_of_a_missing_count_is_a_dash():
    assert report._fmt(math.nan, "tracking_from_env_step") == "–"
    assert report._fmt(None, "env_steps") == "–"
    assert report._fmt(40960.0, "env_steps") == "40960"


@pytest.mark.parametrize("module_name, target", [("report", "write_report"),
                                                 ("sweep", "run_sweep")])
def test_ctrl_c_is_one_line_and_status_130_not_an_error(tmp_path, capsys, monkeypatch,
                                                        module_name, target):
    import importlib

    module = importlib.import_module(f"alf_entropy.experiments.{module_name}")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, target, interrupted)
    if module_name == "sweep":
        monkeypatch.setattr(module, "load_spec", lambda path: {})
        argv = ["--spec", str(tmp_path / "spec.json"), "--sweep_dir", str(tmp_path)]
    else:
        argv = [str(tmp_path)]
    assert module.main(argv) == 130
    err = capsys.readouterr().err
    assert err.strip() == err.strip().splitlines()[0]  # one line
    assert err.startswith(f"{module.PROG}: stopped by SIGINT") and "error" not in err


def test_seeds_of_one_sweep_are_grouped_under_its_name():
    """Runs named only ``seed=N`` (one sweep's dir) form a group named after the sweep."""
    from alf_entropy.experiments.report import RunData, _group_label

    runs = [RunData.__new__(RunData) for _ in range(2)]
    for k, run in enumerate(runs):
        run.name = f"seed={k}"
    assert _group_label(runs, "sac_cartpole") == "sac_cartpole"
    assert _group_label(runs, "") == "seed=0"
