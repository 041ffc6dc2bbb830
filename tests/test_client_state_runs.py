"""The data-heterogeneity methods in whole runs: personalised evaluation, client state in
checkpoints (exact resume), the process pool, masks with FedGMR, bytes and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import fedgmr_in_process, simulate, tiny_config
from fedgmr.algorithm.encoding import payload_nbytes
from fedgmr.errors import ConfigError
from fedgmr.experiment.build import build_experiment
from fedgmr.experiment.runner import run_experiment
from fedgmr.methods import resolve_config
from fedgmr.strategy.scaffold import ScaffoldControl

PERSONAL = {"client_test_fraction": 0.2}


def _raw(method: str, **sections) -> dict:
    run = {"max_steps": 6, "eval_every": 1, "personal_eval_every": 1, **sections.pop("run", {})}
    data = {**PERSONAL, **sections.pop("data", {})}
    return tiny_config(method=method, run=run, data=data, **sections)


def test_personal_metrics_for_every_kind_of_method():
    records, exp = simulate(_raw("fedavg"))
    rec = records[-1]
    accs = rec["personal_accuracies"]
    assert len(accs) == 10 and rec["personal_accuracy"] == pytest.approx(sum(accs) / 10, abs=1e-12)
    assert rec["personal_worst10"] == min(accs)  # ceil(10 % of 10) = the one worst client
    # FedAvg's personal model is the global model: scored on each client's own test split
    part = exp.partition
    assert all(len(t) > 0 for t in part.client_test)
    assert all(set(t).isdisjoint(c) for t, c in zip(part.client_test, part.clients))
    # Ditto's personal models differ from the global one once clients trained
    ditto, _ = simulate(_raw("ditto"))
    assert ditto[-1]["personal_accuracies"] != ditto[-1]["accuracy"]
    assert ditto[-1]["accuracy"] == records[-1]["accuracy"]  # Ditto's global model is FedAvg's, exactly


def test_personal_evaluation_needs_client_test_splits():
    with pytest.raises(ConfigError, match="client_test_fraction"):
        resolve_config(tiny_config(run={"max_steps": 2, "personal_eval_every": 1}))


def test_personal_evaluation_off_changes_nothing_else():
    """The personal metrics are pure evaluation: with them on, every other key is the same."""
    on, _ = simulate(_raw("fedavg"))
    off, _ = simulate(tiny_config(method="fedavg", data=PERSONAL, run={"max_steps": 6, "eval_every": 1}))
    strip = lambda r: {k: v for k, v in r.items() if not k.startswith("personal")}  # noqa: E731
    assert [strip(r) for r in on] == off


@pytest.mark.parametrize("method, extra", [("scaffold", {}), ("ditto", {}), ("fedbn", {"model": {"name": "cnn",
                                                                                                  "options": {}}})])
def test_client_state_resumes_exactly(tmp_path: Path, method: str, extra: dict):
    """Stopped after step 5, its last checkpoint at step 4: the run directory a kill -9 at that
    moment leaves (the suite's one kill -9 of a real process: tests/test_run_dir.py).
    ``fedgmr run --resume`` (in this process) picks it up to the uninterrupted metrics."""
    cfg = resolve_config(_raw(method, run={"max_steps": 8, "checkpoint_every": 2}, **extra))
    out, ref = tmp_path / "killed", tmp_path / "ref"
    assert run_experiment(cfg, out, stop_after_steps=5)["interrupted"]
    from safetensors.torch import load_file

    saved = load_file(out / "checkpoint" / "state.safetensors")
    assert any(k.startswith("sim/client/") for k in saved), "client state is not in the checkpoint"
    assert not (out / "summary.json").exists() and _step(out) == 4
    fedgmr_in_process("run", "--resume", str(out), "-q", check=True)
    run_experiment(cfg, ref)
    assert (out / "metrics.jsonl").read_bytes() == (ref / "metrics.jsonl").read_bytes()


@pytest.mark.parametrize("method", ["scaffold", "ditto"])
def test_process_pool_matches_serial_with_client_state(method: str):
    serial, exp_s = simulate(_raw(method))
    pool, exp_p = simulate(_raw(method, run={"executor": "process", "workers": 1}))
    assert serial == pool
    assert torch.equal(exp_s.strategy.params, exp_p.strategy.params)
    assert exp_s.simulator.client_states.keys() == exp_p.simulator.client_states.keys()
    for c, st in exp_s.simulator.client_states.items():
        assert all(torch.equal(v, exp_p.simulator.client_states[c][k]) for k, v in st.items())


def test_scaffold_doubles_the_payload_both_ways():
    avg, _ = simulate(_raw("fedavg", run={"max_steps": 2}))
    sc, _ = simulate(_raw("scaffold", run={"max_steps": 2}, aggregation={"weighting": "samples"}))
    # the same model on the same clients: c goes down with x, delta_c up with delta y (one header each)
    first_avg, first_sc = avg[1], sc[1]
    assert first_sc["uploads"] == first_avg["uploads"] == 10 and first_sc["downloads"] == first_avg["downloads"]
    numel = exp_numel = build_experiment(resolve_config(_raw("fedavg"))).space.numel
    scale = 2.0e6 / payload_nbytes(exp_numel)  # network.model_size_mb: 2
    # exactly 4 more bytes per coordinate per message (one header each way, mask codes unchanged)
    assert first_sc["bytes_up"] - first_avg["bytes_up"] == pytest.approx(10 * 4 * numel * scale, rel=1e-12)
    assert first_sc["bytes_down"] - first_avg["bytes_down"] == pytest.approx(
        first_avg["downloads"] * 4 * numel * scale, rel=1e-12)


def test_scaffold_on_fedgmr_masks_keeps_c_on_the_masks():
    """FedGMR synchronous (wo_asyn) with SCAFFOLD: c is zero wherever no client's mask reaches."""
    records, exp = simulate(tiny_config(method="fedgmr_wo_asyn", local={"algorithm": "scaffold"},
                                        clients={"heterogeneity": [0.1] * 5 + [0.2] * 5},
                                        restoration={"trigger": "none"}, submodel={"refresh_every": None},
                                        run={"max_steps": 4, "eval_every": 1}))
    s = exp.strategy
    c = s.plugin(ScaffoldControl).c
    held = torch.zeros_like(c, dtype=torch.bool)
    for m in s._held.values():
        held |= m
    assert not bool(held.all()), "the masks cover every coordinate: the test shows nothing"
    assert bool((c[~held] == 0).all()) and bool((c[held] != 0).any())
    for c, st in exp.simulator.client_states.items():
        assert bool((st["c_i"][~st["held"]] == 0).all())


def test_fedgmr_prox_and_ditto_keep_pruned_coordinates_zero_in_a_run():
    _, exp = simulate(tiny_config(method="fedgmr", local={"algorithm": "ditto"}, run={"max_steps": 4}))
    states = exp.simulator.client_states
    assert states and any(not bool(st["held"].all()) for st in states.values())
    for st in states.values():
        assert bool((st["v"][~st["held"]] == 0).all())
    records, exp = simulate(tiny_config(method="fedgmr_prox", local={"prox_mu": 1.0}, run={"max_steps": 4}))
    assert records[-1]["step"] == 4 and not exp.simulator.client_states  # FedProx keeps no state


@pytest.mark.parametrize("set_, match", [
    ({"method": "fedgmr", "local": {"algorithm": "scaffold"}}, "synchronous-only"),
    ({"method": "scaffold", "training": {"momentum": 0.9}}, "momentum or weight decay"),
    ({"method": "scaffold", "training": {"weight_decay": 1e-4}}, "momentum or weight decay"),
    ({"method": "heterofl", "local": {"algorithm": "fedprox"}}, "own client procedure"),
    ({"method": "fedbn"}, "has none"),  # the tiny MLP has no BatchNorm
    ({"method": "fedgmr", "local": {"algorithm": "nope"}}, r"unknown client algorithm 'nope' \(known: .*scaffold"),
    ({"data": {"feature_shift": ["invert", "sepia"]}}, r"unknown feature shift 'sepia' \(known: .*invert"),
])
def test_refused_combinations_are_one_line_config_errors(set_, match):
    raw = tiny_config(run={"max_steps": 2})
    raw.update({k: ({**raw.get(k, {}), **v} if isinstance(v, dict) else v) for k, v in set_.items()})
    with pytest.raises(ConfigError, match=match) as err:
        cfg = resolve_config(raw)
        build_experiment(cfg).executor.close()
    assert "\n" not in str(err.value)


def test_flower_runs_stateful_client_methods_and_refuses_client_models_only():
    from fedgmr.flower.server_app import refuse_client_state

    for m in ("fedprox", "scaffold", "ditto"):  # client state stays on the node under Flower
        refuse_client_state(resolve_config(tiny_config(method=m)))
    with pytest.raises(ConfigError, match="Flower"):  # no global model: its result is the client models
        refuse_client_state(resolve_config(tiny_config(method="local_only")))


def test_feature_shift_transforms_each_clients_images():
    _, plain = simulate(tiny_config(model={"name": "cnn", "options": {}}, run={"max_steps": 1}))
    raw = tiny_config(model={"name": "cnn", "options": {}}, run={"max_steps": 1},
                      data={"feature_shift": ["none", "invert", "rotate"]})
    _, shifted = simulate(raw)
    a, b = plain.executor.workload.client_data, shifted.executor.workload.client_data
    assert torch.equal(a[0][0], b[0][0]) and torch.equal(a[3][0], b[3][0])  # "none" (clients 0, 3)
    lo, hi = float(plain.data.train.x.min()), float(plain.data.train.x.max())
    assert torch.allclose(b[1][0], (lo + hi) - a[1][0])  # inverted
    assert torch.equal(b[2][0], torch.rot90(a[2][0], 1, dims=(-2, -1)))  # rotated
    assert all(torch.equal(a[i][1], b[i][1]) for i in range(10))  # labels untouched


# ------------------------------------------------------------------ checkpoints
def _step(out: Path) -> int:
    try:
        return int(json.loads((out / "checkpoint" / "manifest.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1


# ------------------------------------------------------------------ tables
def test_compare_and_table_use_one_metric_never_mixed(tmp_path: Path):
    from fedgmr.errors import FedGMRError, RunDirError
    from fedgmr.experiment.metrics import compare_runs
    from fedgmr.experiment.table import build_table, read_run, render

    dirs = {}
    for m in ("ditto", "fedavg"):
        dirs[m] = tmp_path / m
        run_experiment(resolve_config(_raw(m, run={"max_steps": None, "max_time": 20, "eval_interval": 5,
                                                   "eval_every": None})), dirs[m])
    plain = tmp_path / "plain"
    run_experiment(resolve_config(tiny_config(method="fedavg", run={"max_steps": None, "max_time": 20,
                                                                     "eval_interval": 5, "eval_every": None})), plain)
    rows = [json.loads(line) for line in (dirs["ditto"] / "metrics.jsonl").read_text().splitlines()]
    personal = compare_runs([dirs["ditto"], dirs["fedavg"]], 10, metric="personal_accuracy")
    glob = compare_runs([dirs["ditto"], dirs["fedavg"]], 10)
    assert personal["metric"] == "personal_accuracy" and glob["metric"] == "accuracy"
    assert personal["runs"][0]["final_accuracy"] == rows[-1]["personal_accuracy"]
    assert glob["runs"][0]["final_accuracy"] == rows[-1]["accuracy"]
    assert personal["runs"][0]["final_accuracy"] != glob["runs"][0]["final_accuracy"]
    with pytest.raises(RunDirError, match="personal_eval_every"):
        compare_runs([dirs["ditto"], plain], 10, metric="personal_accuracy")
    table = build_table([read_run(dirs[m], "personal_worst10") for m in dirs], 10, mri_of=None)
    assert "personal_worst10 (%) at t*" in render(table)
    with pytest.raises(FedGMRError, match="one table shows one"):
        build_table([read_run(dirs["ditto"], "personal_accuracy"), read_run(dirs["fedavg"])], 10, mri_of=None)
