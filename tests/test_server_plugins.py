"""Server plug-ins (fedgmr/strategy/plugins.py): a plug-in composed into FedGMR's one
strategy gives what the method's server gave, hooks run in order, and two plug-ins that
replace one hook are refused in one line - by the strategy and by the composition."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from fedgmr.algorithm.aggregation import RULES
from fedgmr.algorithm.local_rules import scaffold_server_control
from fedgmr.algorithm.params import ParamSpace, get_buffers
from fedgmr.algorithm.policies import FullModelPolicy
from fedgmr.algorithm.restoration import DensityLadder
from fedgmr.algorithm.staleness import make_staleness
from fedgmr.baselines.feddyn import FedDynState
from fedgmr.baselines.fednova import FedNovaStep, fednova_server_model
from fedgmr.errors import ConfigError
from fedgmr.strategy.compose import ServerPart, compose_strategy
from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy
from fedgmr.strategy.messages import Assignment, Reply, StepReport
from fedgmr.strategy.plugins import ServerPlugin, plugin_conflict
from fedgmr.strategy.scaffold import ScaffoldControl

T = torch.tensor


def _strategy(plugins=(), n: int = 2, start=(1.0, 1.0), weighting: str = "samples") -> MaskedBufferedStrategy:
    model = nn.Linear(2, 1, bias=False)
    space = ParamSpace(model)
    return MaskedBufferedStrategy(space, T(list(start)), get_buffers(model), FullModelPolicy(space),
                                  DensityLadder((1.0,), [0] * n), RULES.get("ma"), make_staleness("constant"),
                                  weighting, False, plugins=list(plugins))


def test_scaffold_composed_into_the_base_strategy_equals_its_math():
    """x <- x + eta_g (mean - x); c <- c + sum_i delta_c_i / N (N = 2 clients hold every coordinate)."""
    s = _strategy([ScaffoldControl(server_lr=0.5)], weighting="equal")
    a0, _ = s.assign(0), s.assign(1)
    assert a0.wire.reply_beside == ("delta_c",) and s.reply_extras == ScaffoldControl.reply_extras
    assert s.receive(Reply(0, 0, T([3.0, 1.0]), 10, extras={"delta_c": T([2.0, 0.0])}))
    assert s.receive(Reply(1, 0, T([1.0, 5.0]), 10, extras={"delta_c": T([0.0, 4.0])}))
    s.aggregate()
    assert torch.allclose(s.params, T([1.5, 2.0]))  # 1 + 0.5 ([2, 3] - 1)
    expected = scaffold_server_control(torch.zeros(2), [(torch.ones(2, dtype=torch.bool), T([2.0, 0.0])),
                                                        (torch.ones(2, dtype=torch.bool), T([0.0, 4.0]))],
                                       torch.full((2,), 2))
    assert torch.equal(s.plugin(ScaffoldControl).c, expected) and torch.allclose(expected, T([1.0, 2.0]))
    # its state is part of the strategy's checkpoint
    s.assign(0)
    s.receive(Reply(0, 1, T([1.0, 1.0]), 10, extras={"delta_c": T([1.0, 1.0])}))
    state, tensors = s.state_dict()
    other = _strategy([ScaffoldControl(server_lr=0.5)], weighting="equal")
    other.load_state_dict(state, {k: v.clone() for k, v in tensors.items()})
    assert torch.equal(other.plugin(ScaffoldControl).c, s.plugin(ScaffoldControl).c)
    s.aggregate(), other.aggregate()
    assert torch.equal(other.plugin(ScaffoldControl).c, s.plugin(ScaffoldControl).c)


def test_fednova_composed_into_the_base_strategy_replaces_the_rules_result():
    s = _strategy([FedNovaStep(max_tau=4)])
    s.assign(0), s.assign(1)
    assert s.receive(Reply(0, 0, T([3.0, 1.0]), 10, extras={"tau": T([2.0])}))
    assert s.receive(Reply(1, 0, T([1.0, 5.0]), 30, extras={"tau": T([4.0])}))
    s.aggregate()
    assert torch.equal(s.params, fednova_server_model(T([1.0, 1.0]), [T([3.0, 1.0]), T([1.0, 5.0])], [2.0, 4.0],
                                                      [10.0, 30.0]))
    assert torch.allclose(s.params, T([1.875, 3.625]))


class _Trace(ServerPlugin):
    """Records the hooks it sees, in a list shared with other plug-ins."""

    def __init__(self, tag: str, seen: list[str]) -> None:
        self.tag, self.seen = tag, seen

    def wire(self, a: Assignment) -> Assignment:
        self.seen.append(f"{self.tag}.wire")
        return a

    def prepare(self, reply: Reply) -> Reply:
        self.seen.append(f"{self.tag}.prepare")
        return reply

    def on_accept(self, update) -> None:
        self.seen.append(f"{self.tag}.accept {update.client_id}")

    def after_aggregate(self, report: StepReport) -> StepReport:
        self.seen.append(f"{self.tag}.after")
        return report

    def record_keys(self, version: int) -> dict:
        return {self.tag: version}


def test_hooks_run_in_the_plugins_order_and_a_plain_plugin_changes_nothing():
    seen: list[str] = []
    s = _strategy([_Trace("a", seen), _Trace("b", seen)])
    plain = _strategy()
    for st in (s, plain):
        st.assign(0)
        assert st.receive(Reply(0, 0, T([3.0, 1.0]), 10))
        st.aggregate()
    assert seen == ["a.wire", "b.wire", "a.prepare", "b.prepare", "a.accept 0", "b.accept 0", "a.after", "b.after"]
    assert torch.equal(s.params, plain.params) and s.record_keys(1) == {"a": 1, "b": 1}
    with pytest.raises(KeyError, match="no ScaffoldControl plug-in"):
        s.plugin(ScaffoldControl)


def test_two_plugins_that_replace_one_hook_are_refused_in_one_line():
    assert plugin_conflict([ScaffoldControl(), FedDynState()]) is None  # step and fusion: no clash
    with pytest.raises(ValueError, match="^FedNova's normalised step and FedDyn's server state both replace the "
                                         "server's fuse: they cannot be combined$"):
        _strategy([FedNovaStep(4), FedDynState()])
    with pytest.raises(ConfigError, match=r"^local.algorithm 'fednova' \(FedNova's normalised step\) and "
                                          r"distill.server \(FedDF\) \(FedDyn's server state\) both replace the "
                                          r"server's fuse: they cannot be combined$"):
        compose_strategy([ServerPart("local.algorithm 'fednova'", None, {"plugins": (FedNovaStep(4),)}),
                          ServerPart("distill.server (FedDF)", None, {"plugins": (FedDynState(),)})])
    # plug-ins of different parts add up, in the parts' order
    a, b = ScaffoldControl(), FedDynState()
    cls, kwargs = compose_strategy([ServerPart("x", None, {"plugins": (a,)}), ServerPart("y", None, {"plugins": (b,)})])
    assert cls is MaskedBufferedStrategy and kwargs["plugins"] == (a, b)
