"""Evaluate a run's saved global model: in full and under each ladder level's mask.

``fedgmr evaluate RUN`` rebuilds the run's experiment from its ``config.yaml`` (the data
included), restores the strategy from the run's checkpoint and evaluates the global model
on the test split: as it is, and multiplied by each level's mask (the per-level accuracy
of ``run.level_eval_every``, for a run that did not log it). It answers "is the largest
sub-model already as good as the full model?" without rerunning anything.

A finished run checkpoints its final model: the one its last records measured. When the
run ended at ``run.max_time`` while the server was still aggregating, the checkpoint keeps
that model (``sim/published/*``) beside the unfinished step's, and it is the one evaluated.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fedgmr.config import read_config_file
from fedgmr.errors import ConfigError, RunDirError
from fedgmr.experiment.build import build_experiment
from fedgmr.experiment.checkpoint import checkpoint_path, load_checkpoint, tensors_under
from fedgmr.experiment.diagnostics import masked_level_accuracy
from fedgmr.experiment.rundir import CONFIG_FILE, SUMMARY_FILE, config_digest, read_run_text


@dataclass
class RunEvaluation:
    """The saved global model of one run, evaluated on the test split."""

    run: str
    step: int
    time: float
    #: the checkpoint holds the run's final model (the run finished after writing it)
    final: bool
    accuracy: float
    loss: float
    #: ladder densities and the accuracy of the global model under each level's mask
    levels: list[float] = field(default_factory=list)
    level_accuracy: list[float] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def level_labels(densities: Sequence[float]) -> list[str]:
    """Column labels ``@d`` for one run's ladder densities, to 3 significant figures.

    Runs whose measured densities differ in the sixth digit (FIARSE's magnitude masks keep
    ties and norm parameters, so its level 0.05 measures 0.0500009 in one seed and 0.0499996
    in another) then share a column. Where 3 digits would merge two levels of the run, more
    are kept.
    """
    for digits in (3, 6):
        labels = [f"@{d:.{digits}g}" for d in densities]
        if len(set(labels)) == len(labels):
            return labels
    return [f"@{d!r}" for d in densities]


def _summary_steps(path: Path) -> int | None:
    """The ``steps`` of a run's summary; None when there is no summary. A summary that
    cannot be read (truncated, not JSON, no ``steps``) is a one-line RunDirError."""
    if not os.path.lexists(path):
        return None
    try:
        # a regular file of bounded size only: a FIFO or a link to /dev/zero is one line, not a hang
        steps = json.loads(read_run_text(path)).get("steps")
        if isinstance(steps, bool) or not isinstance(steps, int):
            raise ValueError("no steps")
    except RunDirError as exc:
        raise RunDirError(f"{exc}; restore it, or remove it to evaluate the checkpoint as an unfinished run") \
            from None
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        raise RunDirError(f"{path} is damaged (truncated or not a run summary): restore it, or remove it to "
                          f"evaluate the checkpoint as an unfinished run") from None
    return steps


def evaluate_run(run_dir: str | Path, levels: bool = True) -> RunEvaluation:
    """Evaluate the global model of ``run_dir``'s checkpoint (see the module docstring).

    Raises ``RunDirError`` for a directory without a config or a checkpoint."""
    from fedgmr.methods import resolve_config

    out = Path(run_dir)
    if not (out / CONFIG_FILE).is_file():
        raise RunDirError(f"{out} is not a run directory (no {CONFIG_FILE})")
    if checkpoint_path(out) is None:
        raise RunDirError(f"{out} has no checkpoint to evaluate (the run had run.checkpoint_every and "
                          f"run.checkpoint_seconds null)")
    config_path = out / CONFIG_FILE
    try:
        raw = read_config_file(config_path)
    except ConfigError as exc:
        raise RunDirError(f"{out} cannot be evaluated: {exc}") from None
    if not raw:
        raise RunDirError(f"{config_path} is empty: not the config of a run")
    state, tensors = load_checkpoint(out)
    if config_digest(raw) != state.get("config_sha256"):
        raise RunDirError(f"{config_path} was changed after the checkpoint was written (it does not match the "
                          f"checkpoint's config hash): the evaluation would rebuild another experiment than the "
                          f"one trained; restore it")
    raw.setdefault("run", {})["executor"] = "serial"  # evaluation trains nothing: no worker pool or Ray
    try:
        cfg = resolve_config(raw)
    except ConfigError as exc:
        raise RunDirError(f"{config_path}: {exc}") from None
    exp = build_experiment(cfg)
    try:
        try:
            exp.strategy.load_state_dict(state["strategy"],
                                         tensors_under(tensors, "strategy"))
        except Exception as exc:  # noqa: BLE001 - a checkpoint that does not fit its own config
            raise RunDirError(f"{checkpoint_path(out)} does not fit {out / CONFIG_FILE}: "
                              f"{type(exc).__name__}: {exc}") from None
        strategy, evaluate = exp.strategy, exp.simulator.evaluator
        params, buffers = strategy.params, strategy.buffers
        step = int(state.get("step", 0))
        sim_tensors = tensors_under(tensors, "sim")
        if "published/params" in sim_tensors:
            # the run ended while the server was aggregating: its last records measured the
            # model published before that aggregation, which is the run's final model
            step = int(state["simulator"]["published_version"])
            params = sim_tensors["published/params"]
            buffers = {k[len("published/buf/"):]: v for k, v in sim_tensors.items() if k.startswith("published/buf/")}
        acc, loss = evaluate(params, buffers, "test")
        ladder = list(strategy.ladder.ladder) if levels else []
        per_level = masked_level_accuracy(params, buffers, [strategy.policy.mask(i) for i in range(len(ladder))],
                                          lambda p, b: evaluate(p, b, "test")[0])
        sim = state.get("simulator", {})
        final = _summary_steps(out / SUMMARY_FILE) == step
        return RunEvaluation(str(out), step, float(sim.get("now", 0.0)), final, float(acc), float(loss),
                             [float(d) for d in ladder], [float(a) for a in per_level])
    finally:
        exp.executor.close()


__all__ = ["RunEvaluation", "evaluate_run", "level_labels"]
