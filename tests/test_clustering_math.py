"""Exact vectors for clustered FL's math (fedgmr.algorithm.clustering, the IFCA and CFL
strategies' aggregation) and the exact rotations of rotated MNIST."""

from __future__ import annotations

import pytest
import torch

from fedgmr.algorithm.clustering import (bipartition, cfl_should_split, cluster_purity, common_coordinates,
                                         cosine_similarities, lowest_loss, same_partition, split_clients,
                                         update_norms)
from fedgmr.data.shift import apply_shift


# ---------------------------------------------------------------------- IFCA
def test_ifca_cluster_choice_is_the_lowest_loss():
    assert lowest_loss([0.9, 0.2, 0.5]) == 1
    assert lowest_loss([0.3, 0.3, 0.1, 0.1]) == 2  # ties: the first
    assert lowest_loss([float("nan"), 2.0, 1.0]) == 2  # NaN never wins
    assert lowest_loss([float("nan"), float("nan")]) == 0


def _strategy(kind: str, n: int, models: list[torch.Tensor], **kw):
    from fedgmr.algorithm.aggregation import RULES
    from fedgmr.algorithm.params import ParamSpace
    from fedgmr.algorithm.policies import FullModelPolicy
    from fedgmr.algorithm.restoration import DensityLadder
    from fedgmr.algorithm.staleness import make_staleness
    from fedgmr.strategy.clustered import CflRouting, IfcaRouting
    from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy

    space = ParamSpace(torch.nn.Linear(1, 1))  # 2 coordinates: weight, bias
    cls = IfcaRouting if kind == "ifca" else CflRouting
    extra = {"cluster_models": models[1:]} if kind == "ifca" else {}
    s = MaskedBufferedStrategy(space, models[0], {}, FullModelPolicy(space), DensityLadder((1.0,), [0] * n),
                               RULES.get("ma"), make_staleness("constant"), "samples", False,
                               plugins=(cls(**extra, **kw),))
    return s, s.plugins[0]


def _reply(s, c: int, values: list[float], n: int, losses: list[float] | None = None):
    from fedgmr.strategy.messages import Reply

    extras = {} if losses is None else {"model_losses": torch.tensor(losses, dtype=torch.float64)}
    return Reply(c, s.version, torch.tensor(values), n, extras=extras)


def test_ifca_hand_computed_round():
    """Two cluster models W0 = (0, 0), W1 = (10, 10); clients 0, 1 pick W0, client 2 picks
    W1 by its losses; the sample-weighted average is taken within each cluster:
    W0' = (1*1 + 3*3) / 4 = 2.5 and (2*1 + 4*3) / 4 = 3.5; W1' = client 2's (12, 14)."""
    s, r = _strategy("ifca", 3, [torch.zeros(2), torch.full((2,), 10.0)], true_groups=[0, 0, 1])
    for c in range(3):
        a = s.assign(c)
        assert [p for p, _ in a.wire.models] == [r.models[0], r.models[1]]  # every cluster model travels
        assert a.wire.reply_plain == 2  # and a loss per model comes back
    assert s.receive(_reply(s, 0, [1.0, 2.0], 1, [0.1, 0.7]))
    assert s.receive(_reply(s, 1, [3.0, 4.0], 3, [0.2, 0.3]))
    assert s.receive(_reply(s, 2, [12.0, 14.0], 5, [0.9, 0.4]))
    s.aggregate()
    assert torch.equal(r.models[0], torch.tensor([2.5, 3.5]))
    assert torch.equal(r.models[1], torch.tensor([12.0, 14.0]))
    assert r.clusters == [0, 0, 1]
    assert torch.equal(s.params, r.models[0])  # the representative: the cluster with most clients
    rec = s.record_keys(s.version)  # the strategy asks its plug-ins
    assert rec["clusters"] == [0, 0, 1] and rec["cluster_purity"] == 1.0 and rec["clusters_recovered"] is True
    assert [p for p, _ in s.client_models(s.version)] == [r.models[0], r.models[0], r.models[1]]


def test_cluster_routing_composed_as_a_part_gives_the_per_cluster_result():
    """Clustering as the builder composes it: a part bringing a plug-in, no class of its own.
    IFCA, W0 = (0, 0), W1 = (10, 10); client 0 picks W0, clients 1 and 2 pick W1: W0' =
    client 0's (2, 4), W1' = (3 * (6, 8) + 1 * (12, 10)) / 4 = (7.5, 8.5), each what the
    strategy's own one-model step gives from that cluster's model; the global model is the
    larger cluster's. A checkpoint keeps the clustered strategy's keys and loads back."""
    from fedgmr.algorithm.aggregation import RULES
    from fedgmr.algorithm.params import ParamSpace
    from fedgmr.algorithm.policies import FullModelPolicy
    from fedgmr.algorithm.restoration import DensityLadder
    from fedgmr.algorithm.staleness import make_staleness
    from fedgmr.strategy.clustered import ClusterRouting, IfcaRouting
    from fedgmr.strategy.compose import ServerPart, compose_strategy
    from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy

    space = ParamSpace(torch.nn.Linear(1, 1))

    def build():
        part = ServerPart("clustering.kind 'ifca'", None,
                          {"plugins": (IfcaRouting(cluster_models=[torch.full((2,), 10.0)]),)})
        cls, kw = compose_strategy([ServerPart("local.algorithm 'sgd'"), part])
        assert cls is MaskedBufferedStrategy
        return cls(space, torch.zeros(2), {}, FullModelPolicy(space), DensityLadder((1.0,), [0] * 3),
                   RULES.get("ma"), make_staleness("constant"), "samples", False, **kw)

    s = build()
    r = s.plugin(ClusterRouting)
    before = list(r.models)
    for c in range(3):
        s.assign(c)
    assert s.receive(_reply(s, 0, [2.0, 4.0], 1, [0.1, 0.5]))
    assert s.receive(_reply(s, 1, [6.0, 8.0], 3, [0.2, 0.1]))
    assert s.receive(_reply(s, 2, [12.0, 10.0], 1, [0.9, 0.1]))
    used = s.incoming
    report = s.aggregate()
    assert report.used == [0, 1, 2]
    assert torch.equal(r.models[0], torch.tensor([2.0, 4.0]))
    assert torch.equal(r.models[1], torch.tensor([7.5, 8.5]))
    for j, members in ((0, [0]), (1, [1, 2])):  # the public one-model step, from the cluster's own model
        ups = [used[c] for c in members]
        p, _ = s.aggregate_model(before[j], {}, ups, [float(u.num_samples) for u in ups])
        assert torch.equal(p, r.models[j])
    assert r.clusters == [0, 1, 1] and s.params is r.models[1]
    state, tensors = s.state_dict()
    assert {"cluster/0/params", "cluster/1/params"} <= set(tensors)
    assert state["clustering"] == {"models": 2, "clusters": [0, 1, 1], "chosen": {"0": 0, "1": 1, "2": 1}}
    t = build()
    t.load_state_dict(state, tensors)
    rt = t.plugin(ClusterRouting)
    assert rt.clusters == [0, 1, 1] and all(torch.equal(a, b) for a, b in zip(rt.models, r.models))
    assert torch.equal(t.params, s.params) and t.record_keys(t.version) == s.record_keys(s.version)


def test_cluster_routing_refuses_a_fusing_plugin_beside_it():
    from fedgmr.strategy.clustered import CflRouting
    from fedgmr.strategy.plugins import ServerPlugin, plugin_conflict

    class Fusing(ServerPlugin):
        name = "a fusion"

        def fuse(self, params, buffers, used):
            return params, buffers

    assert plugin_conflict([CflRouting(), Fusing()]) == (
        "CFL's cluster routing steps models of its own and a fusion fuses the global one: they cannot be combined")
    assert "both replace the server's step models" in plugin_conflict([CflRouting(), CflRouting()])


def test_ifca_refuses_a_reply_without_losses():
    s, r = _strategy("ifca", 2, [torch.zeros(2), torch.ones(2)])
    s.assign(0)
    assert not s.receive(_reply(s, 0, [1.0, 2.0], 1))
    assert not s.receive(_reply(s, 0, [1.0, 2.0], 1, [0.1, 0.2, 0.3]))  # k = 2 losses needed
    assert s.rejected == 2 and s.receive(_reply(s, 0, [1.0, 2.0], 1, [0.1, 0.2]))


# ---------------------------------------------------------------------- CFL
def test_cfl_split_criterion():
    # (mean norm, max norm, size, round): Sattler's defaults eps1 = 0.4, eps2 = 1.6, > 2 clients, round > 20
    assert cfl_should_split(0.3, 1.7, 3, 21, 0.4, 1.6)
    assert not cfl_should_split(0.4, 1.7, 3, 21, 0.4, 1.6)  # strict: mean norm must be below eps1
    assert not cfl_should_split(0.3, 1.6, 3, 21, 0.4, 1.6)  # and the max above eps2
    assert not cfl_should_split(0.3, 1.7, 2, 21, 0.4, 1.6)  # a pair is never split
    assert not cfl_should_split(0.3, 1.7, 3, 20, 0.4, 1.6)  # not before the warm-up is over


def test_update_norms_and_cosine_similarities():
    u = torch.tensor([[3.0, 4.0], [-3.0, -4.0], [0.0, 2.0]])
    mean_norm, max_norm = update_norms(u)
    assert mean_norm == pytest.approx(2 / 3) and max_norm == 5.0
    s = cosine_similarities(u)
    assert s[0, 1] == pytest.approx(-1.0) and s[0, 2] == pytest.approx(0.8) and s[1, 2] == pytest.approx(-0.8)
    assert cosine_similarities(torch.zeros(2, 3)).abs().max() == 0  # a zero update is orthogonal to all


def test_bipartition_complete_linkage():
    # two groups of directions: {0, 2} around +x, {1, 3} around -x
    u = torch.tensor([[1.0, 0.1], [-1.0, 0.0], [1.0, -0.1], [-1.0, 0.2]])
    assert bipartition(cosine_similarities(u)) == ([0, 2], [1, 3])
    # complete linkage: after {0, 1} (0.9), 2 would join it by single linkage (s12 = 0.85) but its
    # least similar member says -0.5, so {2, 3} (0.8) merge instead
    s = torch.tensor([[1.0, 0.9, -0.5, -0.5], [0.9, 1.0, 0.85, 0.0], [-0.5, 0.85, 1.0, 0.8],
                      [-0.5, 0.0, 0.8, 1.0]])
    assert bipartition(s) == ([0, 1], [2, 3])
    with pytest.raises(ValueError):
        bipartition(torch.ones(1, 1))


def test_split_maps_positions_to_client_ids():
    """The cluster {3, 5, 8, 9} (positions 0..3 in the similarity matrix) splits into client
    ids, not positions (Sattler's reference code returned positions: [0, 2] / [1, 3])."""
    u = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [1.0, 0.1], [-1.0, 0.1]])
    assert split_clients([3, 5, 8, 9], cosine_similarities(u)) == ([3, 8], [5, 9])


def test_cfl_strategy_splits_by_client_id():
    """Clients 0..3 in one cluster, updates +-x: round 1 (warm-up 0) splits {0, 2} from
    {1, 3}; each half is averaged from the parent model into its own cluster model."""
    s, r = _strategy("cfl", 4, [torch.zeros(2)], eps1=0.5, eps2=0.5, min_size=2, warmup=0, true_groups=[0, 1, 0, 1])
    for c in range(4):
        assert [p for p, _ in s.assign(c).wire.models] == [r.models[0]]
    ups = {0: [1.0, 0.0], 1: [-1.0, 0.0], 2: [1.0, 0.2], 3: [-1.0, 0.2]}
    for c, v in ups.items():
        assert s.receive(_reply(s, c, v, 1))
    s.aggregate()
    assert r.clusters == [0, 1, 0, 1] and len(r.models) == 2
    assert torch.allclose(r.models[0], torch.tensor([1.0, 0.1])) and torch.allclose(r.models[1], torch.tensor([-1.0, 0.1]))
    assert r.splits[0]["into"] == [[0, 2], [1, 3]]
    assert s.record_keys(s.version)["clusters_recovered"] is True
    # the next round: each client gets its own cluster's model
    assert [p for p, _ in s.assign(1).wire.models] == [r.models[1]]


def test_cfl_strategy_does_not_split_when_the_mean_update_is_large():
    s, r = _strategy("cfl", 3, [torch.zeros(2)], warmup=0)
    for c in range(3):
        s.assign(c)
        s.receive(_reply(s, c, [2.0, 0.0], 1))  # agreeing updates: mean norm 2 > eps1 = 0.4
    s.aggregate()
    assert r.clusters == [0, 0, 0] and len(r.models) == 1 and r.norms[0] == (2.0, 2.0)


def test_updates_compared_on_common_coordinates():
    """Under masks only the coordinates every update holds count (the lowest level's)."""
    m_small = torch.tensor([True, False, False])
    m_big = torch.tensor([True, True, False])
    assert torch.equal(common_coordinates([m_big, m_small]), m_small)


# ---------------------------------------------------------------------- purity
def test_cluster_purity_and_recovery():
    truth = [0, 0, 1, 1, 2, 2]
    assert cluster_purity([5, 5, 7, 7, 9, 9], truth) == 1.0 and same_partition([5, 5, 7, 7, 9, 9], truth)
    assert cluster_purity([0, 0, 0, 0, 1, 1], truth) == pytest.approx(4 / 6)
    assert not same_partition([0, 0, 0, 0, 1, 1], truth)
    assert not same_partition([0, 1, 2, 3, 4, 5], truth)  # pure but over-split
    assert cluster_purity([-1, -1, 0, 0, -1, -1], truth) == 1.0  # unassigned clients left out
    assert cluster_purity([-1] * 6, truth) is None


# ---------------------------------------------------------------------- rotations
def test_exact_rotations():
    x = torch.arange(2 * 1 * 3 * 3, dtype=torch.float32).view(2, 1, 3, 3)
    for k in range(4):
        assert torch.equal(apply_shift(f"rot{90 * k}", x, 0.0, 17.0, 0, 0, 0), torch.rot90(x, k, dims=(-2, -1)))
    r = apply_shift("rot90", x, 0.0, 17.0, 0, 0, 0)
    assert torch.equal(apply_shift("rot270", r, 0.0, 17.0, 0, 0, 0), x)  # exact: no interpolation


def test_true_groups_from_feature_shift():
    from fedgmr.strategy.clustered import true_groups

    assert true_groups(["rot0", "rot90", "rot180", "rot270"], 6) == [0, 1, 2, 3, 0, 1]
    assert true_groups(["rot0", "rot90", "rot0"], 4) == [0, 1, 0, 0]
    assert true_groups([], 3) is None
