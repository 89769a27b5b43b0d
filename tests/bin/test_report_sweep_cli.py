"""alf-entropy-report and -sweep: integer counts in tables, a clean Ctrl-C (issue 22, item 7)."""

import math

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from alf_entropy.experiments import figures, report, report_tables  # noqa: E402


def _row(**values):
    row = {c: math.nan for c in report.METRIC_COLUMNS}
    row.update(run="r+seed=0", group="r", seed=0)
    row.update(values)
    return row


def test_env_step_counts_print_as_integers_other_metrics_to_four_digits(tmp_path):
    rows = [
        _row(
            env_steps=12288,
            tracking_from_env_step=12290.0,
            tracking_rmse=0.0123456,
            max_alpha_change_x=123456.0,
        )
    ]
    _, md_path = report_tables.write_tables(rows, str(tmp_path))
    table = open(md_path, encoding="utf-8").read()
    cells = [line for line in table.splitlines() if line.startswith("| r+seed=0 |")][0].split(" | ")
    by_column = dict(zip(report.METRIC_COLUMNS, (c.strip("| ") for c in cells)))
    assert by_column["env_steps"] == "12288"
    assert by_column["tracking_from_env_step"] == "12290"
    assert by_column["tracking_rmse"] == "0.01235"
    assert by_column["max_alpha_change_x"] == "1.235e+05"  # a ratio, not a count
    assert by_column["final_return"] == "–"


def test_fmt_of_a_missing_count_is_a_dash():
    assert report_tables.format_cell(math.nan, "tracking_from_env_step") == "–"
    assert report_tables.format_cell(None, "env_steps") == "–"
    assert report_tables.format_cell(40960.0, "env_steps") == "40960"


@pytest.mark.parametrize(
    "module_name, target", [("report", "write_report"), ("sweep", "run_sweep")]
)
def test_ctrl_c_is_one_line_and_status_130_not_an_error(
    tmp_path, capsys, monkeypatch, module_name, target
):
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


def _synthetic_run(name, seed, entropy, target, stage, config=""):
    """A RunData with one value per iteration (as the shipped configs log)."""
    from alf_entropy.experiments.report import RunData

    steps = np.arange(len(entropy), dtype=np.float64)
    scalars = {
        "entropy": (steps, np.asarray(entropy, dtype=np.float64)),
        "target_entropy": (steps, np.full(len(entropy), float(target))),
        "stage": (steps, np.asarray(stage, dtype=np.float64)),
        "env_steps": (steps, 1000.0 * (steps + 1)),
    }
    return RunData(f"/runs/{name}", scalars, f"OnPolicyTrainer.seed = {seed}\nX.y = 1\n{config}")


def test_a_run_whose_entropy_never_reached_the_target_says_so():
    """Two targets never reached: the rows' metrics are empty, and the note says why."""
    rows = [
        report.run_metrics(_synthetic_run(f"t{t}", 0, [0.69, 0.68, 0.67], t, [0, 0, 0]))
        for t in (0.5, 0.6)
    ]
    for row, t in zip(rows, (0.5, 0.6)):
        assert row["note"] == f"{report.NOT_REACHED} (final entropy 0.67, target {t:.3g})"
        assert math.isnan(row["tracking_rmse"]) and math.isnan(row["tracking_from_env_step"])
    assert rows[0]["note"] != rows[1]["note"]
    reached = report.run_metrics(_synthetic_run("r", 0, [0.69, 0.6, 0.5], 0.5, [0, 0, 0]))
    assert reached["note"] == "" and reached["tracking_from_env_step"] == 3000


def test_the_multi_seed_stage_is_drawn_per_seed_never_averaged():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    stages = ([-2, -1, 0, 0, 1], [-2, -1, -1, 1, 1], [-2, 0, 0, 0, 0])
    runs = [
        _synthetic_run(f"seed={k}", k, [0.7 + 0.1 * k] * 5, 0.5, s) for k, s in enumerate(stages)
    ]
    fig, ax = plt.subplots()
    figures._draw(ax, "stage", [runs], ["g"])
    ys = [line.get_ydata().tolist() for line in ax.get_lines()]
    assert sorted(ys) == sorted(list(map(float, s)) for s in stages)  # each seed's own levels
    assert not any(isinstance(c, PolyCollection) for c in ax.collections)  # no band
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["g (3 seeds)"]
    plt.close(fig)
    fig, ax = plt.subplots()
    figures._draw(ax, "entropy", [runs], ["g"])  # other panels keep the mean and its band
    entropy_line = ax.get_lines()[0]
    np.testing.assert_allclose(entropy_line.get_ydata(), [0.8] * 5)
    assert any(isinstance(c, PolyCollection) for c in ax.collections)
    plt.close(fig)


@pytest.mark.parametrize(
    "limits, named",
    [
        ("OnPolicyTrainer.num_iterations = 150", "num_iterations = 150"),  # issue 63: 33 of 150
        ("OnPolicyTrainer.num_iterations = 33", None),
        (
            "OnPolicyTrainer.num_iterations = 0\nOnPolicyTrainer.num_env_steps = 153600",
            "num_env_steps = 153600",
        ),
        ("OnPolicyTrainer.num_env_steps = 33000", None),
        ("OnPolicyTrainer.num_iterations = 40\nOnPolicyTrainer.summary_interval = 10", None),
        (
            "OnPolicyTrainer.num_iterations = 43\nOnPolicyTrainer.summary_interval = 10",
            "num_iterations = 43",
        ),
        ("", None),  # no limits known: no note
    ],
)
def test_a_run_stopped_before_its_limit_has_a_note(limits, named):
    """Logged iterations 0..32 (33,000 env steps): a note where they end before the limit;
    with summary_interval = 10 up to 9 more iterations may have gone unlogged."""
    run = _synthetic_run("r", 0, [0.5] * 33, 0.5, [0] * 33, config=limits)
    note = report.run_metrics(run)["note"]
    if named is None:
        assert note == ""
    else:
        assert note == f"{report.STOPPED_EARLY} ({named}): 33 iterations, 33000 env steps logged"


def test_a_group_value_from_one_seed_has_no_interval(tmp_path):
    """A zero-width interval from one value (issue 63) is the mean, the count and no interval."""
    rows = [
        _row(run="g+seed=0", group="g", seed=0, tracking_rmse=0.02, final_eval_return=10.0),
        _row(run="g+seed=1", group="g", seed=1, final_eval_return=20.0),
        _row(run="g+seed=2", group="g", seed=2, final_eval_return=30.0),
    ]
    _, md_path = report_tables.write_tables(rows, str(tmp_path))
    line = [ln for ln in open(md_path, encoding="utf-8") if ln.startswith("| g | 3 |")][0]
    cells = dict(zip(report_tables.GROUP_COLUMNS, (c.strip() for c in line.split("|")[3:])))
    assert cells["tracking_rmse"] == "0.02 (1 of 3 seeds: no interval)"
    mean, lo, hi = report.cm.bootstrap_ci([10.0, 20.0, 30.0])
    assert cells["final_eval_return"] == f"{mean:.4g} [{lo:.4g}, {hi:.4g}]"
    assert cells["frac_5pct_below"] == "–"
    rows[2]["final_eval_return"] = math.nan
    _, md_path = report_tables.write_tables(rows, str(tmp_path))
    assert "15 [10, 20] (2 of 3 seeds)" in open(md_path, encoding="utf-8").read()
