"""Clustered FL (IFCA, CFL) and local-only training in whole runs: cluster assignments and
purity in the metrics, the k x download, exact resume with cluster models in the
checkpoint, the process pool (and Ray when installed) equal to serial, FedGMR masks, and
the combinations that are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import simulate, tiny_config
from fedgmr.errors import ConfigError
from fedgmr.experiment.build import build_experiment
from fedgmr.experiment.runner import run_experiment
from fedgmr.methods import resolve_config

ROT = ["rot0", "rot180"]  # digits are square: two true groups, clients alternate
CFL = {"warmup": 1, "eps1": 50.0, "eps2": 0.01}  # loose thresholds: a split in the first rounds


def _raw(method: str, **sections) -> dict:
    run = {"max_steps": 6, "eval_every": 1, "personal_eval_every": 1, **sections.pop("run", {})}
    data = {"client_test_fraction": 0.2, "feature_shift": ROT, **sections.pop("data", {})}
    clustering = {"k": 2, **(CFL if method == "cfl" else {}), **sections.pop("clustering", {})}
    return tiny_config(method=method, run=run, data=data, clustering=clustering, **sections)


@pytest.mark.parametrize("method", ["ifca", "cfl"])
def test_clusters_and_purity_are_logged(method: str):
    records, exp = simulate(_raw(method))
    last = records[-1]
    assert last["true_groups"] == [0, 1] * 5
    assert len(last["clusters"]) == 10 and all(c >= 0 for c in last["clusters"])
    assert 0 < last["cluster_purity"] <= 1 and isinstance(last["clusters_recovered"], bool)
    assert "personal_accuracy" in last
    # each client's own model is its cluster's
    from fedgmr.strategy.clustered import ClusterRouting

    models = exp.strategy.client_models(exp.simulator.published_version)
    view = exp.strategy.plugin(ClusterRouting).view(exp.simulator.published_version)
    assert all(p is view.models[c] for (p, _), c in zip(models, view.clusters))
    if method == "cfl":
        assert last["cfl_splits"] >= 1 and last["cluster_models"] >= 2


def test_ifca_downloads_k_models():
    avg, _ = simulate(_raw("fedavg", run={"max_steps": 1}, clustering={"k": 4}))
    ifca, exp = simulate(_raw("ifca", run={"max_steps": 1}, clustering={"k": 3}))
    # the first round: the same 10 downloads, each carrying 3 models instead of 1 (in one payload)
    assert ifca[1]["downloads"] == avg[1]["downloads"] == 10
    # ... and each reply carries its model plus its 3 losses (float32), which FedAvg's does not
    assert ifca[1]["bytes_up"] - avg[1]["bytes_up"] == 10 * 3 * 4
    sim, mask = exp.simulator, exp.strategy.policy.mask(0)
    assert avg[1]["bytes_down"] == pytest.approx(10 * sim._payload(exp.space.numel, mask), rel=1e-12)
    assert ifca[1]["bytes_down"] == pytest.approx(10 * sim._payload(3 * exp.space.numel, mask), rel=1e-12)


def test_ifca_clients_pick_distinct_initial_models():
    from fedgmr.strategy.clustered import ClusterRouting

    _, exp = simulate(_raw("ifca", run={"max_steps": 1}))
    s = exp.strategy.plugin(ClusterRouting)
    assert len(s.models) == 2 and not torch.equal(s.models[0], s.models[1])


@pytest.mark.parametrize("method", ["ifca", "cfl"])
def test_clustered_runs_resume_exactly(tmp_path: Path, method: str):
    cfg = resolve_config(_raw(method, run={"max_steps": 8, "checkpoint_every": 2}))
    out, ref = tmp_path / "killed", tmp_path / "ref"
    assert run_experiment(cfg, out, stop_after_steps=5)["interrupted"]
    from safetensors.torch import load_file

    saved = load_file(out / "checkpoint" / "state.safetensors")
    assert any("cluster/1/params" in k for k in saved), "the cluster models are not in the checkpoint"
    run_experiment(cfg, out, resume=True)
    run_experiment(cfg, ref)
    assert (out / "metrics.jsonl").read_bytes() == (ref / "metrics.jsonl").read_bytes()


@pytest.mark.parametrize("method, extra", [("ifca", {}), ("cfl", {}),
                                           ("fedavg", {"local": {"algorithm": "local_sgd"}})])
def test_process_pool_matches_serial(method: str, extra: dict):
    serial, exp_s = simulate(_raw(method, **extra))
    pool, exp_p = simulate(_raw(method, run={"executor": "process", "workers": 2}, **extra))
    assert serial == pool
    from fedgmr.strategy.clustered import ClusterRouting

    def models(exp) -> list:
        return exp.strategy.plugin(ClusterRouting).models if method != "fedavg" else []

    assert all(torch.equal(a, b) for a, b in zip(models(exp_s), models(exp_p)))


def test_ray_matches_serial(ray_session):  # the test process's one Ray instance (conftest)
    serial, _ = simulate(_raw("ifca", run={"max_steps": 3}))
    ray, _ = simulate(_raw("ifca", run={"max_steps": 3, "executor": "ray", "workers": 2}))
    assert serial == ray


def test_clustering_on_fedgmr_masks():
    """FedGMR's sub-models, synchronous, with CFL and IFCA: updates compared on the lowest
    level's coordinates; pruned coordinates of every cluster model stay where the masks put them."""
    for kind in ("cfl", "ifca"):
        raw = _raw("fedgmr_wo_asyn", clustering={"kind": kind, **CFL}, network={"ims": False},
                   restoration={"trigger": "none"}, submodel={"refresh_every": None})
        records, exp = simulate(raw)
        assert records[-1]["avg_density"] < 1 and all(c >= 0 for c in records[-1]["clusters"])


def test_local_sgd_never_aggregates():
    records, exp = simulate(_raw("fedavg", local={"algorithm": "local_sgd"}))
    first = build_experiment(resolve_config(_raw("fedavg", local={"algorithm": "local_sgd"})))
    first.executor.close()
    assert torch.equal(exp.strategy.params, first.strategy.params)  # the global model never moves
    assert records[-1]["personal_accuracy"] > records[0]["personal_accuracy"]  # each client's own does
    assert all("w" in st for st in exp.simulator.client_states.values())
    # nothing travels: the clients build the initial model from the seed, as FedMD's do
    assert records[-1]["downloads"] > 0 and records[-1]["bytes_down"] == records[-1]["bytes_up"] == 0


@pytest.mark.parametrize("set_, match", [
    ({"method": "fedgmr", "clustering": {"kind": "cfl"}}, "synchronous-only"),
    ({"method": "fedgmr", "clustering": {"kind": "ifca"}}, "network.ims"),
    ({"method": "heterofl", "clustering": {"kind": "ifca"}}, "width baseline"),
    ({"method": "scaffold", "clustering": {"kind": "ifca"}}, "local.algorithm"),
    ({"method": "ifca", "aggregation": {"max_update_norm": 5.0}}, "update-norm"),
    ({"method": "fedavg", "clustering": {"kind": "kmeans"}}, r"unknown clustering 'kmeans' \(known: cfl, ifca\)"),
])
def test_refused_combinations_are_one_line_config_errors(set_, match):
    raw = tiny_config(run={"max_steps": 2})
    raw.update({k: ({**raw.get(k, {}), **v} if isinstance(v, dict) else v) for k, v in set_.items()})
    with pytest.raises(ConfigError, match=match) as err:
        cfg = resolve_config(raw)
        build_experiment(cfg).executor.close()
    assert "\n" not in str(err.value)


def test_flower_refuses_clustering():
    from fedgmr.flower.server_app import refuse_client_state

    for m in ("ifca", "cfl"):
        with pytest.raises(ConfigError, match="Flower"):
            refuse_client_state(resolve_config(tiny_config(method=m)))
