"""Issue 41, items 6 and 7: personalised methods report their clients' accuracy; the
smaller usability fixes (compare of a missing run, the demo keeping earlier results, a
t* past the run's end, one wall time per run)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from conftest import run_cli, tiny_config


def _write(tmp_path: Path, name: str, **sections) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tiny_config(**sections)))
    return path


@pytest.mark.parametrize("method", ["fedbn", "ditto", "fedmrl", "fedmd", "local_only", "standalone"])
def test_a_personalised_method_carves_a_client_test_split_by_default(method):
    from fedgmr.methods import get_dotted, is_personalised, resolve_config  # noqa: F401

    raw = tiny_config(method=method)
    if method == "fedbn":
        raw["model"] = {"name": "cnn", "options": {"batch_norm": True}}
    if method == "fedmd":
        raw["distill"] = {"proxy": {"name": "digits"}}
    try:
        cfg = resolve_config(raw)
    except Exception as exc:  # a method's own further needs (e.g. fedmd's proxy) are not this test's
        pytest.skip(f"{method}: {exc}")
    assert is_personalised(cfg.local.algorithm)
    assert cfg.data.client_test_fraction == 0.2 and cfg.run.personal_eval_every == 1


def test_a_personalised_method_without_a_client_test_split_is_refused_in_one_line():
    from fedgmr.errors import ConfigError
    from fedgmr.methods import resolve_config

    with pytest.raises(ConfigError, match=r"method 'ditto' keeps a model per client.*client_test_fraction must be > 0"):
        resolve_config(tiny_config(method="ditto", data={"client_test_fraction": 0.0}))
    kept = resolve_config(tiny_config(method="ditto", data={"client_test_fraction": 0.3}))
    assert kept.data.client_test_fraction == 0.3
    plain = resolve_config(tiny_config(method="fedavg"))  # a global-model method is unchanged
    assert plain.data.client_test_fraction == 0.0 and plain.run.personal_eval_every is None


def test_personalised_runs_print_summarise_and_compare_their_clients_accuracy(tmp_path: Path):
    run = {"max_steps": 6, "eval_every": 2, "device": "cpu"}
    for method in ("ditto", "local_only"):
        _write(tmp_path, method, method=method, run=run)
        res = run_cli(["run", f"{method}.yaml", "--out", f"runs/{method}", "-q"], tmp_path)
        assert res.returncode == 0, res.stderr
        summary = json.loads((tmp_path / "runs" / method / "summary.json").read_text())
        personal = summary["personal_accuracy"]
        assert summary["headline_metric"] == "personal_accuracy"
        assert set(personal) >= {"mean", "std", "worst10"} and 0 <= personal["worst10"] <= personal["mean"] <= 1
        assert f"final personal accuracy {100 * personal['mean']:.2f}% ± {100 * personal['std']:.2f} " \
               f"(worst 10%: {100 * personal['worst10']:.2f}%)" in res.stdout
        # the global model is shown only where it means something (Ditto's), and labelled
        assert ("global model" in res.stdout) == (method == "ditto")
        assert summary["global_model_meaningful"] == (method == "ditto")
        assert "final accuracy" not in res.stdout
        # one wall time: the printed figure is the summary's
        assert f"({summary['wall_time_s']:.1f}s wall)" in res.stdout
    res = run_cli(["compare", "runs/ditto", "runs/local_only", "--t-star", "20", "--json"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["metric"] == "personal_accuracy"
    res = run_cli(["table", "runs", "--t-star", "20", "--format", "csv"], tmp_path)
    assert res.returncode == 0, res.stderr
    explicit = run_cli(["table", "runs", "--t-star", "20", "--format", "csv", "--metric", "personal_accuracy"],
                       tmp_path)
    plain = run_cli(["table", "runs", "--t-star", "20", "--format", "csv", "--metric", "accuracy"], tmp_path)
    assert res.stdout == explicit.stdout != plain.stdout


def test_a_global_model_run_keeps_its_headline(tmp_path: Path):
    _write(tmp_path, "avg", method="fedavg", run={"max_steps": 2, "eval_every": 1, "device": "cpu"})
    res = run_cli(["run", "avg.yaml", "--out", "r", "-q"], tmp_path)
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert "headline_metric" not in summary and "personal_accuracy" not in summary
    assert re.search(r"^fedavg: final accuracy \d+\.\d\d% at t=", res.stdout)
    assert f"({summary['wall_time_s']:.1f}s wall)" in res.stdout


def test_compare_of_a_missing_run_says_so_before_asking_for_t_star(tmp_path: Path):
    res = run_cli(["compare", "runs/nope"], tmp_path)
    assert res.returncode == 3, res.stderr
    assert res.stderr.strip() == "error: run directory runs/nope does not exist"


def test_a_run_that_ends_before_its_t_star_is_warned_about(tmp_path: Path):
    raw = tiny_config()
    raw["run"] = {"max_time": 10, "t_star": 20, "eval_interval": 5, "device": "cpu"}
    cfg = tmp_path / "short.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    (tmp_path / "afile").write_text("x")
    res = run_cli(["run", cfg.name, "--out", "afile"], tmp_path)  # refused later: no run needed to see the warning
    assert res.returncode != 0
    assert "warning: run.max_time 10 s ends before run.t_star 20 s: the run will have no Acc@t*" in res.stderr


def test_the_demo_moves_earlier_results_aside_and_refuses_a_foreign_folder(tmp_path: Path):
    from fedgmr.cli import _keep_previous_demo
    from fedgmr.errors import RunDirError

    out = tmp_path / "demo-out"
    assert _keep_previous_demo(out) is None
    out.mkdir()
    assert _keep_previous_demo(out) is None  # empty: used as it is
    for name in ("fedgmr", "fedavg"):
        (out / name).mkdir()
        (out / name / "summary.json").write_text("{}")
    (out / "compare.png").write_bytes(b"png")
    kept = _keep_previous_demo(out)
    assert kept == tmp_path / "demo-out.previous-1" and (kept / "fedgmr" / "summary.json").exists()
    assert not out.exists()
    (out / "fedavg").mkdir(parents=True)
    assert _keep_previous_demo(out) == tmp_path / "demo-out.previous-2"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match="holds other files than a demo's results"):
        _keep_previous_demo(out)
    res = run_cli(["demo", "--out", "demo-out"], tmp_path)  # refused before any run starts
    assert res.returncode == 3 and "holds other files than a demo's results" in res.stderr
    assert (out / "notes.txt").read_text() == "mine"


def test_every_command_is_listed_with_a_whole_sentence():
    """`fedgmr --help` shows each command's first paragraph: one sentence, never cut."""
    import typer.main

    from fedgmr.cli import app

    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        text = (command.help or "").strip()
        first = text.split("\n\n")[0]
        assert first and "\n" not in first and first.endswith("."), (name, first)


def test_presets_are_listed_with_a_line_from_their_header(tmp_path: Path):
    from fedgmr.presets import preset_description, preset_names

    res = run_cli(["presets"], tmp_path)
    assert res.returncode == 0
    lines = res.stdout.splitlines()
    assert [line.split()[0] for line in lines] == preset_names()
    assert "quickstart     FedGMR on scikit-learn digits: 10 clients, High heterogeneity, non-IID (Dirichlet 0.5)." \
        in lines
    assert preset_description("cifar10") == "CIFAR-10 as in the FedGMR paper"
    assert all(0 < len(preset_description(n)) <= 110 and "\n" not in preset_description(n) for n in preset_names())


def test_compare_shows_distinguishing_ends_of_long_run_paths():
    from fedgmr.cli import distinct_suffixes, format_compare

    a, b = "/very/long/common/prefix/of/experiments/seed-run/a/fedgmr", \
        "/very/long/common/prefix/of/experiments/seed-run/b/fedgmr"
    assert distinct_suffixes([a, b]) == ["…/a/fedgmr", "…/b/fedgmr"]
    assert distinct_suffixes(["demo-out/fedgmr", "demo-out/fedavg"]) == ["demo-out/fedgmr", "demo-out/fedavg"]
    row = {"n": 1, "acc_at_t": 0.9, "std": 0.01, "time_to_target": 10.0, "window": 50.0, "final_accuracy": 0.95,
           "end_time": 100.0, "std_kind": "window"}
    result = {"t_star": 50.0, "target": 0.8, "metric": "accuracy", "mri": 1.0, "mri_of": "x", "over": ["y"],
              "runs": [{**row, "run": a, "method": "x"}, {**row, "run": b, "method": "y"}]}
    text = format_compare(result)
    assert "…/a/fedgmr" in text and "…/b/fedgmr" in text


def test_a_multi_run_plot_has_a_title_a_labelled_t_star_and_its_legend_below_the_curves(tmp_path, monkeypatch):
    from fedgmr.experiment import plots

    seen = {}

    def keep(fig, path):
        ax = fig.axes[0]
        legend = ax.get_legend()
        seen["title"] = ax.get_title()
        seen["labels"] = [t.get_text() for t in legend.get_texts()]
        fig.canvas.draw()
        seen["legend_top"] = legend.get_window_extent().y1
        seen["axes_bottom"] = ax.get_window_extent().y0
        plots._pyplot().close(fig)
        return Path(path)

    monkeypatch.setattr(plots, "_save", keep)
    rows = [{"time": float(t), "accuracy": 0.1 * t, "avg_density": 0.5} for t in range(6)]
    plots.plot_runs([("fedgmr", rows), ("fedavg", rows)], tmp_path / "p.png", t_star=3.0)
    assert seen["title"] == "test accuracy: fedgmr vs fedavg"
    assert seen["labels"] == ["fedgmr", "fedavg", "t* = 3 s", "average density (dashed, right axis)"]
    assert seen["legend_top"] <= seen["axes_bottom"]  # below the axes: it covers no curve


def test_evaluate_of_a_plugin_run_without_its_import_suggests_it(tmp_path: Path):
    import sys

    from fedgmr.models import MODELS

    (tmp_path / "round2_plugin.py").write_text(
        "from fedgmr.models import MODELS\nMODELS.register('round2_mlp', MODELS.get('mlp'))\n")
    _write(tmp_path, "p", model={"name": "round2_mlp", "options": {"hidden": [16]}},
           run={"max_steps": 2, "eval_every": 1, "device": "cpu"})
    try:
        res = run_cli(["run", "p.yaml", "--out", "runs/p", "-q", "--import", "round2_plugin.py"], tmp_path)
        assert res.returncode == 0, res.stderr
    finally:
        if "round2_mlp" in MODELS:
            MODELS.unregister("round2_mlp")
        sys.modules.pop("round2_plugin", None)
    res = run_cli(["evaluate", "runs/p"], tmp_path)
    assert res.returncode == 3, res.stderr  # the run directory's config cannot be rebuilt here
    line, = res.stderr.splitlines()
    assert "unknown model 'round2_mlp'" in line and "pass the same --import as the run had" in line


def test_the_options_commands_share_have_one_metavar_everywhere():
    import typer.main

    from fedgmr.cli import app

    group = typer.main.get_command(app)
    seen: dict[str, set[str]] = {}
    for name in ("run", "config", "demo", "sweep", "evaluate", "methods"):
        ctx = group.commands[name].make_context(name, ["--help"], resilient_parsing=True)
        for param in group.commands[name].params:
            if param.opts and param.opts[0] in ("--set", "--import"):
                seen.setdefault(param.opts[0], set()).add(param.make_metavar(ctx))
    assert seen == {"--set": {"KEY=VALUE"}, "--import": {"MODULE"}}


def test_the_progress_line_the_printed_line_and_the_summary_give_one_wall_time(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("FEDGMR_PROGRESS", "")
    monkeypatch.setenv("FEDGMR_PROGRESS_EVERY", "1000")  # only the final line
    _write(tmp_path, "w", method="fedavg", run={"max_steps": 2, "eval_every": 1, "device": "cpu"})
    res = run_cli(["run", "w.yaml", "--out", "r"], tmp_path)
    assert res.returncode == 0, res.stderr
    wall = json.loads((tmp_path / "r" / "summary.json").read_text())["wall_time_s"]
    assert f"({wall:.1f}s wall)" in res.stdout
    h, m, s = map(int, re.findall(r"elapsed=(\d+):(\d\d):(\d\d)", res.stderr)[-1])
    assert abs(3600 * h + 60 * m + s - wall) <= 1.0, (res.stderr, wall)
