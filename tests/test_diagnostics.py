"""Per-level and per-client accuracy: exact on hand-made models, cadence, and no effect
on any other metric of a run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import scaled, simulate, tiny_config, tiny_text_config
from fedgmr.experiment.diagnostics import Diagnostics, masked_level_accuracy

EXTRA = ("levels", "level_accuracy", "client_accuracy", "class_accuracy", "predicted_share")


def run(raw: dict) -> list[dict]:
    return simulate(raw)[0]


def test_masked_level_accuracy_evaluates_the_params_under_each_mask():
    params = torch.tensor([1.0, 2.0, 3.0, 4.0])
    masks = [torch.tensor([True, False, False, False]), torch.tensor([True, True, False, True]),
             torch.ones(4, dtype=torch.bool)]
    seen: list[list[float]] = []

    def score(p: torch.Tensor, bufs: dict) -> float:
        seen.append(p.tolist())
        return float(p.sum())

    assert masked_level_accuracy(params, {}, masks, score) == [1.0, 7.0, 10.0]
    assert seen == [[1.0, 0.0, 0.0, 0.0], [1.0, 2.0, 0.0, 4.0], [1.0, 2.0, 3.0, 4.0]]
    assert params.tolist() == [1.0, 2.0, 3.0, 4.0]  # the global model is untouched


def test_cadence_counts_test_evaluations_and_each_version_is_evaluated_once():
    calls = {"level": 0, "client": 0}

    def level_score(p: torch.Tensor, bufs: dict) -> float:
        calls["level"] += 1
        return float(p.sum())

    def split_score(p: torch.Tensor, bufs: dict, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        calls["client"] += 1
        return float((p.sum() * x.sum()).item()), 0.0

    diag = Diagnostics(level_score, lambda: [torch.tensor([True, False]), torch.tensor([True, True])],
                       lambda: [0.5, 1.0], [(torch.tensor([1.0]), torch.tensor([0])),
                                            (torch.empty(0), torch.empty(0, dtype=torch.long))],
                       split_score, level_every=2, client_every=3)
    p = torch.tensor([2.0, 3.0])
    got = [diag(i, version, p, {}) for i, version in enumerate([0, 0, 1, 1, 1, 2, 2])]
    assert [sorted(g) for g in got] == [
        ["client_accuracy", "level_accuracy", "levels"], [], ["level_accuracy", "levels"], ["client_accuracy"],
        ["level_accuracy", "levels"], [], ["client_accuracy", "level_accuracy", "levels"]]
    assert got[0]["level_accuracy"] == [2.0, 5.0] and got[0]["levels"] == [0.5, 1.0]
    assert got[0]["client_accuracy"] == [5.0, None]  # no held-out samples: None, not 0
    # versions 0, 1 and 2 each evaluated once per kind, however often they were due
    assert calls == {"level": 3 * 2, "client": 3}


def test_level_accuracy_has_one_value_per_level_and_the_full_level_is_the_test_accuracy():
    recs = run(tiny_config(run={"max_steps": 12, "eval_every": 2, "level_eval_every": 1}))
    ladder = [0.05, 0.1, 0.2, 0.5, 1.0]
    for r in recs:
        assert r["levels"] == ladder
        assert len(r["level_accuracy"]) == len(ladder)
        assert r["level_accuracy"][-1] == r["accuracy"]  # the full mask is the global model itself
    # once trained, the smallest sub-model is a different (worse) model than the full one
    assert recs[-1]["level_accuracy"][0] < recs[-1]["accuracy"]


@pytest.mark.parametrize("method", ["fedgmr", "heterofl"])
def test_diagnostics_change_no_other_metric(method: str):
    base = tiny_config(method=method, run={"max_steps": 12, "eval_every": 2},
                       data={"name": "digits", "partition": "dirichlet", "alpha": 0.5, "client_val_fraction": 0.2})
    plain = run(base)
    on = run({**base, "run": {**base["run"], "level_eval_every": 2, "client_eval_every": 3, "class_eval_every": 2}})
    assert [{k: v for k, v in r.items() if k not in EXTRA} for r in on] == plain
    assert [i for i, r in enumerate(on) if "class_accuracy" in r] == list(range(0, len(on), 2))
    assert [i for i, r in enumerate(on) if "level_accuracy" in r] == list(range(0, len(on), 2))
    assert [i for i, r in enumerate(on) if "client_accuracy" in r] == list(range(0, len(on), 3))
    clients = on[-1]["client_accuracy"] if "client_accuracy" in on[-1] else on[-2]["client_accuracy"]
    assert len(clients) == 10 and all(0.0 <= a <= 1.0 for a in clients)
    assert len(set(clients)) > 1  # the global model serves the label-skewed clients unequally


def test_client_accuracy_without_a_held_out_split_is_a_config_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fedgmr", "run", "quickstart", "--out", str(tmp_path / "r"),
                           "--set", "run.client_eval_every=1"], capture_output=True, text=True,
                          timeout=scaled(120))
    assert proc.returncode == 2
    assert "data.client_val_fraction" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_level_accuracy_reaches_metrics_jsonl_from_the_cli(tmp_path):
    out = tmp_path / "r"
    proc = subprocess.run([sys.executable, "-m", "fedgmr", "run", "quickstart", "--out", str(out), "-q",
                           "--set", "run.max_time=null", "--set", "run.max_steps=6", "--set", "run.eval_interval=null",
                           "--set", "run.eval_every=2", "--set", "run.level_eval_every=2"],
                          capture_output=True, text=True, timeout=scaled(300))
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [("level_accuracy" in r) for r in rows] == [i % 2 == 0 for i in range(len(rows))]
    assert all(r["level_accuracy"][-1] == r["accuracy"] for r in rows if "level_accuracy" in r)


# ------------------------------------------------------------------ per-class accuracy
def test_class_report_by_hand():
    """logits = x: samples (1, 0) -> class 0, (0, 1) -> class 1. Labels 0, 1, 1, 0 with
    predictions 0, 1, 0, 0: class 0 2/2, class 1 1/2, class 2 absent (None); predicted
    shares 3/4, 1/4, 0."""
    from fedgmr.training.evaluate import class_report

    model = torch.nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]))
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    y = torch.tensor([0, 1, 1, 0])
    for batch in (512, 1, 3):  # batching changes nothing
        assert class_report(model, x, y, 3, batch_size=batch) == {
            "class_accuracy": [1.0, 0.5, None], "predicted_share": [0.75, 0.25, 0.0]}


def test_class_accuracy_weighted_by_the_class_counts_is_the_test_accuracy():
    recs, exp = simulate(tiny_config(run={"max_steps": 8, "eval_every": 2, "class_eval_every": 1}))
    from fedgmr.experiment.build import client_splits

    ty = client_splits(exp.config, exp.data, exp.partition).global_test[1]
    counts = torch.bincount(ty, minlength=exp.data.num_classes).tolist()
    for r in recs:
        acc, share = r["class_accuracy"], r["predicted_share"]
        assert len(acc) == len(share) == exp.data.num_classes
        assert sum(a * n for a, n in zip(acc, counts)) / sum(counts) == pytest.approx(r["accuracy"], abs=1e-12)
        assert sum(share) == pytest.approx(1.0, abs=1e-12)
    # an early model does not predict the classes evenly (a later one should do better)
    assert max(recs[0]["predicted_share"]) > 0.15


@pytest.mark.parametrize("extra, match", [({"method": "fedmd", "distill": {"proxy": {"name": "digits", "size": 50}}},
                                           "fedmd has none")])
def test_class_accuracy_refusals_are_one_line_config_errors(extra: dict, match: str):
    from fedgmr.errors import ConfigError
    from fedgmr.experiment.build import build_experiment
    from fedgmr.methods import resolve_config

    with pytest.raises(ConfigError, match=match) as err:
        build_experiment(resolve_config(tiny_config(run={"class_eval_every": 1}, **extra))).executor.close()
    assert "\n" not in str(err.value)


def test_class_accuracy_needs_a_classification_task():
    from fedgmr.errors import ConfigError
    from fedgmr.experiment.build import build_experiment
    from fedgmr.methods import resolve_config

    raw = tiny_text_config("tiny_text_for_class_eval", run={"class_eval_every": 1})
    with pytest.raises(ConfigError, match="needs a classification task") as err:
        build_experiment(resolve_config(raw)).executor.close()
    assert "\n" not in str(err.value)
