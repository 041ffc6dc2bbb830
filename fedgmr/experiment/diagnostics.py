"""Extra evaluations of the global model, logged beside test accuracy at their own cadence.

* ``level_accuracy``: the global model evaluated under each ladder level's mask (the
  coordinates a client on that level holds; pruned ones read as zero), as the HeteroFL and
  FjORD papers report per-width accuracy. ``levels`` (the levels' densities) comes with it.
  It shows whether a capacity bottleneck is real: a small level far below the full model
  means the clients on it train a model that cannot fit the task.
* ``client_accuracy``: the global model on each client's own held-out split
  (``data.client_val_fraction``), one value per client; its spread shows who the global
  model serves badly.
* ``class_accuracy`` / ``predicted_share``: the global model's accuracy on each class of
  the test split, and the share of test samples it predicts as each class. Under label
  skew they show whose classes the global model serves (a model that predicts mostly the
  classes of the fastest clients, say).
* ``personal_accuracy`` / ``personal_std`` / ``personal_worst10`` (and the per-client
  ``personal_accuracies``): every client's *own* model - the global model for a method
  without personal state, Ditto's personal model, the global model with the client's own
  BatchNorm layers for FedBN - on the client's own test split
  (``data.client_test_fraction``): mean, population std and the mean of the worst 10 %
  of clients. A metric of its own: never compare it with ``accuracy``.

* ``coverage_*`` / ``pruned_energy*`` (``run.coverage_eval_every``): the coverage of the
  last aggregation over the updates it used (``coverage_hist``, ``coverage_min``,
  ``coverage_groups``, ``coverage_group_min``) and the pruned-weight energy of the
  evaluated model under each level's mask (``pruned_energy``, ``pruned_energy_mean``);
  docs/methods/epm.md defines them.

All are pure evaluation: they never touch the strategy's state, so turning them on
changes no other metric. Each is computed once per published model version.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from fedgmr.algorithm.coverage import level_energy
from fedgmr.algorithm.local_rules import personal_summary

#: ``evaluate(params, buffers, x, y)`` -> (accuracy, loss)
SplitEvaluator = Callable[[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, torch.Tensor], tuple[float, float]]


def masked_level_accuracy(params: torch.Tensor, buffers: dict[str, torch.Tensor], masks: Sequence[torch.Tensor],
                          evaluate_masked: Callable[[torch.Tensor, dict[str, torch.Tensor]], float]) -> list[float]:
    """Accuracy of ``params`` under each mask in ``masks`` (a full mask reuses nothing:
    each level is evaluated, so the numbers are comparable across runs)."""
    return [evaluate_masked(params * m.to(params.dtype), buffers) for m in masks]


@dataclass
class Diagnostics:
    """Per-level and per-client accuracy at a cadence counted in test evaluations.

    level_every / client_every: every that many test evaluations (1: at each one;
    None: never). ``level_masks()`` returns the current mask of every ladder level and
    ``levels()`` their densities (they may change when a policy refreshes its ranking).
    """

    evaluate_test: Callable[[torch.Tensor, dict[str, torch.Tensor]], float]
    level_masks: Callable[[], list[torch.Tensor]]
    levels: Callable[[], list[float]]
    client_splits: list[tuple[torch.Tensor, torch.Tensor]]
    evaluate_split: SplitEvaluator
    level_every: int | None = None
    client_every: int | None = None
    #: each client's test split, and ``personal_models(params, buffers)`` -> per client
    #: (params, buffers) of its own model
    personal_splits: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    personal_models: Callable[[torch.Tensor, dict[str, torch.Tensor]], list[tuple[Any, Any]]] | None = None
    personal_every: int | None = None
    #: ``evaluate_personal(own, buffers, x, y)`` -> (accuracy, loss) for one of
    #: ``personal_models``' pairs (None: :attr:`evaluate_split`); FedMRL's own models are modules
    evaluate_personal: Callable[[Any, Any, torch.Tensor, torch.Tensor], tuple[float, float]] | None = None
    #: changes whenever some client's state changed (personal models move without a new version)
    personal_stamp: Callable[[], Any] = lambda: 0
    #: the last aggregation's coverage record keys and each client's current ladder level
    coverage_stats: Callable[[], dict[str, Any]] | None = None
    client_levels: Callable[[], list[int]] = list
    coverage_every: int | None = None
    #: ``class_report(params, buffers)`` -> {"class_accuracy": ..., "predicted_share": ...}
    class_report: Callable[[torch.Tensor, dict[str, torch.Tensor]], dict[str, Any]] | None = None
    class_every: int | None = None
    _cache: dict[str, tuple[int, Any]] = field(default_factory=dict, repr=False)

    @property
    def enabled(self) -> bool:
        return (self.level_every is not None or self.client_every is not None or self.personal_every is not None
                or self.coverage_every is not None or self.class_every is not None)

    def _due(self, every: int | None, index: int) -> bool:
        return every is not None and index % every == 0

    def _cached(self, key: str, version: Any, compute: Callable[[], Any]) -> Any:
        hit = self._cache.get(key)
        if hit is None or hit[0] != version:
            hit = (version, compute())
            self._cache[key] = hit
        return hit[1]

    def __call__(self, index: int, version: int, params: torch.Tensor,
                 buffers: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The diagnostics due at the ``index``-th test evaluation (0-based) of model
        ``version``: a dict of record keys, empty when none is due."""
        out: dict[str, Any] = {}
        if self._due(self.level_every, index):
            out["levels"] = [float(d) for d in self.levels()]
            out["level_accuracy"] = self._cached("level", version, lambda: masked_level_accuracy(
                params, buffers, self.level_masks(), self.evaluate_test))
        if self._due(self.client_every, index):
            out["client_accuracy"] = self._cached("client", version, lambda: [
                self.evaluate_split(params, buffers, x, y)[0] if len(y) else None for x, y in self.client_splits])
        if self._due(self.class_every, index) and self.class_report is not None:
            report = self.class_report
            out.update(self._cached("class", version, lambda: report(params, buffers)))
        if self._due(self.coverage_every, index) and self.coverage_stats is not None:
            out.update(self.coverage_stats())
            out.update(level_energy(params, self.level_masks(), self.client_levels()))
        if self._due(self.personal_every, index) and self.personal_models is not None:
            out.update(self._cached("personal", (version, self.personal_stamp()),
                                    lambda: self._personal(params, buffers)))
        return out

    def _personal(self, params: torch.Tensor, buffers: dict[str, torch.Tensor]) -> dict[str, Any]:
        assert self.personal_models is not None
        models = self.personal_models(params, buffers)
        score = self.evaluate_personal or self.evaluate_split
        accs = [score(p, b, x, y)[0] if len(y) else None
                for (p, b), (x, y) in zip(models, self.personal_splits)]
        return {**personal_summary([a for a in accs if a is not None]), "personal_accuracies": accs}


__all__ = ["Diagnostics", "masked_level_accuracy"]
