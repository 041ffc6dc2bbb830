"""The baselines inside a built experiment: structured byte counts, label split reaching
the aggregation, static BN statistics from the server, GMR moving width levels."""

from __future__ import annotations

import torch

from conftest import tiny_config
from fedgmr.baselines.server import LabelSplit
from fedgmr.algorithm.encoding import payload_nbytes
from fedgmr.baselines.wire import STRUCTURED_CODE_BYTES
from fedgmr.experiment.build import build_experiment
from fedgmr.methods import resolve_config


def _build(method: str, **sections):
    return build_experiment(resolve_config(tiny_config(method=method, **sections)))


def test_heterofl_bytes_are_structured_payloads_and_label_split_reaches_aggregation():
    exp = _build("heterofl")
    sim, st = exp.simulator, exp.strategy
    assert isinstance(st.plugin(LabelSplit), LabelSplit)
    assert st.policy.code_nbytes(st.policy.mask(0)) == STRUCTURED_CODE_BYTES  # a rate and a shift, no mask bits
    sim.start()
    masks = [a.mask for a in st._outstanding.values()]
    # first contact: values plus the 12-byte slice description, one payload per client (no IMS)
    expected = sum(payload_nbytes(int(m.sum()), STRUCTURED_CODE_BYTES) for m in masks) * sim.byte_scale
    assert abs(sim.bytes_down - expected) < 1e-6 * expected
    sim.run(max_steps=1)
    out = exp.space.output_layer
    w = next(p for p in exp.space.params if p.name == f"{out}.weight")
    labels = [set(exp.data.train.y[torch.as_tensor(idx)].tolist()) for idx in exp.partition.clients]
    for cid, keep in enumerate(st.plugin(LabelSplit).label_keep):
        rows = keep[w.slice].view(w.shape).all(1)
        assert set(rows.nonzero().view(-1).tolist()) == labels[cid]
    densities = st.densities()
    assert max(densities) == 1.0 and min(densities) < 0.1


def test_static_bn_statistics_come_from_the_server_pass():
    exp = _build("heterofl_aux", model={"name": "cnn", "options": {}})
    st = exp.strategy
    assert st.bn_stats is not None
    exp.simulator.run(max_steps=2)
    again = st.bn_stats(st.params)
    for k, v in again.items():
        if v.is_floating_point():
            assert torch.allclose(st.buffers[k], v)


def test_gmr_moves_width_levels_up():
    exp = _build("fedrolex_aux_gmr", restoration={"check_interval": 1, "patience": 1, "min_delta": 1.0})
    before = list(exp.strategy.ladder.levels)
    exp.simulator.run(max_steps=6)
    after = exp.strategy.ladder.levels
    assert exp.strategy.ladder.restorations > 0 and all(a >= b for a, b in zip(after, before)) and after != before


def test_heterofl_and_fedrolex_clip_at_one_like_their_published_code_and_the_user_can_change_it():
    from fedgmr.experiment.build import train_settings
    for method in ("heterofl", "fedrolex", "heterofl_aux", "fedrolex_aux_gmr"):
        cfg = resolve_config(tiny_config(method=method))
        assert cfg.training.clip_grad_norm == 1.0, method
    for method in ("fedgmr", "fedavg", "fjord", "fiarse"):
        assert resolve_config(tiny_config(method=method)).training.clip_grad_norm is None, method
    exp = _build("fedrolex")
    assert exp.executor.workload.settings.clip_grad_norm == 1.0  # it reaches the clients' trainer
    cfg = resolve_config(tiny_config(method="fedrolex", training={"clip_grad_norm": 5.0}))
    assert cfg.training.clip_grad_norm == 5.0
    off = resolve_config(tiny_config(method="fedrolex", training={"clip_grad_norm": 0}))
    assert off.training.clip_grad_norm == 0
    assert train_settings(off, exp.data).clip_grad_norm is None  # 0 switches it off
    fedgmr = resolve_config(tiny_config(method="fedgmr", training={"clip_grad_norm": 2.0}))
    assert train_settings(fedgmr, exp.data).clip_grad_norm == 2.0


def test_each_baseline_trains_through_the_one_client_extension_point_and_pickles():
    import pickle

    import pytest

    from fedgmr.baselines.training import FiarseClient, OrderedDropoutClient, WidthClient
    from fedgmr.errors import ConfigError
    from fedgmr.sim.executor import ClientWorkload, TrainJob
    from fedgmr.training.local import TrainSettings

    assert not hasattr(ClientWorkload(lambda: torch.nn.Linear(2, 2), [], [], TrainSettings()), "trainer")
    for method, cls in (("heterofl", WidthClient), ("fedrolex", WidthClient), ("fjord", OrderedDropoutClient),
                        ("fiarse", FiarseClient)):
        exp = _build(method)
        workload = exp.executor.workload
        assert type(workload.client_method) is cls, method  # the workload's client method, nothing beside it
        assert not workload.client_method.stateful and workload.client_method.needs_extras == ()
        st = exp.strategy
        mask = st.policy.mask(0)
        job = TrainJob(0, 0, 7, st.params, st.buffers, mask)
        a = workload.run(job)
        b = pickle.loads(pickle.dumps(workload)).run(job)  # the process pool's and Ray's copy
        assert torch.equal(a.values, b.values) and a.loss == b.loss, method
        assert a.values.numel() == int(mask.sum())
        # a client method of its own and a baseline's: refused in one line
        with pytest.raises(ConfigError, match=f"submodel.policy '{method}' trains with its own client procedure"):
            _build(method, local={"algorithm": "scaffold"})

