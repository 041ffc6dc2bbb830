"""Shipped presets: they validate, the paper presets carry the paper's settings (docs/reference.md §13),
a paper preset without its data fails with the loader's one-line message, a paper preset runs
on tiny files, and the offline presets run end to end on ../shared/data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import fedgmr_in_process
from fedgmr.config import apply_overrides
from fedgmr.experiment.runner import run_experiment
from fedgmr.methods import resolve_config
from fedgmr.presets import load_preset, preset_names, preset_path

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

PAPER = {  # docs/reference.md §13: lr, momentum, wd, batch, local steps, check, patience (High, non-IID), MB, t*, stop
    "femnist": dict(model="conv2", partition="natural", lr=0.25, momentum=0.0, wd=0.0, batch=20, steps=5,
                    check=25, patience=7, mb=25.98, t_star=70_000, max_time=150_000, grid=250),
    "cifar10": dict(model="vgg11", partition="dirichlet", lr=0.25, momentum=0.0, wd=0.0, batch=20, steps=5,
                    check=25, patience=15, mb=37.2, t_star=220_000, max_time=305_000, grid=1000),
    "imagenet100": dict(model="resnet18", partition="dirichlet", lr=0.02, momentum=0.9, wd=1e-4, batch=20,
                        steps=5, check=50, patience=25, mb=43.1, t_star=250_000, max_time=280_000, grid=1000),
    "stackoverflow": dict(model="transformer_lm", partition="natural", lr=2e-3, momentum=0.9, wd=1e-4,
                          batch=16, steps=10, check=25, patience=10, mb=25.98, t_star=70_000,
                          max_time=3_000_000, grid=250),
}
OFFLINE = {"mnist": "mnist", "fashion_mnist": "fashion-mnist", "shakespeare": "shakespeare"}
LAYOUT_HINT = {"femnist": "train/*.json", "cifar10": "data_batch_1", "imagenet100": "classes.txt",
               "stackoverflow": "stackoverflow.sqlite"}


def test_expected_presets_ship() -> None:
    assert set(PAPER) | set(OFFLINE) | {"quickstart"} <= set(preset_names())


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_validates_and_explains_itself(name: str) -> None:
    cfg = resolve_config(load_preset(name))
    assert cfg.name == name and cfg.method == "fedgmr"
    assert preset_path(name).read_text().startswith("#"), "a preset starts with a header comment"


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_presets_carry_the_paper_settings(name: str) -> None:
    want = PAPER[name]
    cfg = resolve_config(load_preset(name))
    assert cfg.model.name == want["model"] and cfg.data.name == name and cfg.data.root is None
    assert cfg.data.partition == want["partition"]
    if want["partition"] == "dirichlet":
        assert cfg.data.alpha == 0.6
    assert cfg.clients.num_clients == 10 and cfg.clients.heterogeneity == "high"
    t = cfg.training
    assert (t.lr, t.momentum, t.weight_decay, t.batch_size, t.local_steps) == pytest.approx(
        (want["lr"], want["momentum"], want["wd"], want["batch"], want["steps"]))
    assert cfg.restoration.trigger == "early_stopping"
    assert (cfg.restoration.check_interval, cfg.restoration.patience) == (want["check"], want["patience"])
    # test accuracy on a virtual-time grid: the Acc@t* window is 20 grid steps of time
    assert cfg.run.eval_every is None and cfg.run.eval_interval == want["grid"]
    assert cfg.submodel.refresh_every == "check_interval" and cfg.submodel.cost_weighted
    assert cfg.network.model_size_mb == pytest.approx(want["mb"])
    assert cfg.run.t_star == want["t_star"] and cfg.run.max_time == want["max_time"]
    assert cfg.submodel.ladder == [0.05, 0.1, 0.2, 0.5, 1.0]
    assert cfg.coordination.mode == "semi_async" and cfg.coordination.trigger == "deadline"
    assert cfg.coordination.deadline_slack == 0.5 and cfg.network.compute.seconds_per_round == 0.5


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_preset_without_data_root_fails_with_one_line(name: str, tmp_path: Path) -> None:
    proc = fedgmr_in_process("run", name, "--out", str(tmp_path / "run"), "-q")  # in this process (conftest.run_cli)
    assert proc.returncode == 4, proc.stderr  # DatasetFormatError: data files missing
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert "data.root" in lines[0] and "expected" in lines[0] and LAYOUT_HINT[name] in lines[0]
    assert "Traceback" not in proc.stderr


def _leaf_file(path: Path, users: dict[str, list[int]], value: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {u: {"x": [[value + 0.01 * y] * 784 for y in ys], "y": ys} for u, ys in users.items()}
    path.write_text(json.dumps({"users": list(users), "num_samples": [len(v) for v in users.values()],
                                "user_data": data}))


def test_femnist_preset_runs_on_tiny_leaf_files(tmp_path: Path) -> None:
    root = tmp_path / "leaf"
    writers = {f"w{i:02d}": [(i + k) % 62 for k in range(6)] for i in range(20)}
    _leaf_file(root / "train" / "all_data_0_train.json", writers, 0.1)
    _leaf_file(root / "test" / "all_data_0_test.json", {u: ys[:2] for u, ys in writers.items()}, 0.1)
    raw = apply_overrides(load_preset("femnist"), [f"data.root={root}", "run.max_steps=2",
                                                   "run.eval_interval=null", "run.eval_every=1"])
    summary = run_experiment(resolve_config(raw), tmp_path / "run")
    assert summary["steps"] == 2 and 0.0 <= summary["final_accuracy"] <= 1.0


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OFFLINE))
def test_offline_preset_runs_end_to_end(name: str, tmp_path: Path) -> None:
    if not (SHARED_DATA / OFFLINE[name]).is_dir():
        pytest.skip(f"{SHARED_DATA / OFFLINE[name]} is absent (offline data sets ship only with the workspace)")
    out = tmp_path / "run"
    # the preset's relative data.root resolves from the repository root, as documented;
    # a tight plateau detector makes restoration fire within the short run
    args = ["run", name, "--out", str(out), "-q", "--set", "run.max_time=120", "--set", "run.eval_interval=20",
            "--set", "restoration.check_interval=2", "--set", "restoration.patience=1",
            "--set", "restoration.min_delta=0.5"]
    proc = fedgmr_in_process(*args, cwd=REPO)  # in this process: the run, without a PyTorch start-up
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert 0 < summary["time"] <= 120 and summary["steps"] >= 4
    assert summary["restorations"] >= 1 and 0.0 < summary["final_accuracy"] <= 1.0
