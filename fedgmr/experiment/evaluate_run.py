"""Evaluate a run's saved global model: in full and under each ladder level's mask.

``fedgmr evaluate RUN`` rebuilds the run's experiment from its ``config.yaml`` (the data
included), restores the strategy from the run's checkpoint and evaluates the global model
on the test split: as it is, and multiplied by each level's mask (the per-level accuracy
of ``run.level_eval_every``, for a run that did not log it). It answers "is the largest
sub-model already as good as the full model?" without rerunning anything.

A finished run checkpoints its final model: the one its last records measured. When the
run ended at ``run.max_time`` while the server was still aggregating, the checkpoint keeps
that model (``sim/published/*``) beside the unfinished step's, and it is the one evaluated.

``fedgmr evaluate RUN --save`` also writes the result into the run directory
(``evaluation.json``: a few hundred bytes, with the checkpoint's step and config hash and
the numeric stack that computed it), so that a run kept without its checkpoint (``measured/``
keeps none) still answers the question: ``fedgmr evaluate RUN --saved`` prints the same
table from the saved files alone, with no checkpoint, data or model needed.

``fedgmr evaluate RUN --classes`` also measures each class's test accuracy (classification
tasks): of the full model and of the model under each level's mask, the same numbers a run
with ``run.class_eval_every`` logs as ``class_accuracy``. Under label skew it shows whose
classes a model serves: a full model whose outer coordinates only one client trains can miss
the classes that client lacks while its small sub-models do not. With ``--save`` they are
kept in ``evaluation.json`` too (``--saved --classes`` prints them again from a clone).
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

#: the file ``fedgmr evaluate --save`` writes into a run directory
EVALUATION_FILE = "evaluation.json"
#: the version of its layout
EVALUATION_FORMAT = 1


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
    #: with ``classes``: each class's accuracy (None for a class the test split lacks), of the
    #: model in full and under each level's mask (aligned with ``levels``); empty otherwise
    class_accuracy: list[float | None] = field(default_factory=list)
    level_class_accuracy: list[list[float | None]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The fields, without the per-class ones when they were not measured."""
        body = asdict(self)
        if not self.class_accuracy:
            del body["class_accuracy"], body["level_class_accuracy"]
        return body

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


def save_evaluation(result: RunEvaluation, run_dir: str | Path, config_sha256: str,
                    environment: dict[str, Any] | None = None) -> Path:
    """Write ``result`` into ``run_dir`` as :data:`EVALUATION_FILE` (atomically: a
    temporary beside it, then a rename); returns its path. ``run`` is stored as the
    directory's name, so the file does not depend on where the run was evaluated."""
    out = Path(run_dir)
    body = {"format": EVALUATION_FORMAT, **result.to_dict(), "run": out.name, "config_sha256": config_sha256,
            "environment": environment or {}}
    path = out / EVALUATION_FILE
    tmp = out / f".{EVALUATION_FILE}.tmp"
    tmp.write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def load_evaluation(run_dir: str | Path) -> RunEvaluation:
    """The evaluation ``fedgmr evaluate --save`` kept in ``run_dir``.

    Raises a one-line ``RunDirError`` when there is none, when it is damaged, or when the
    run's ``config.yaml`` is no longer the config it was computed for."""
    out = Path(run_dir)
    path = out / EVALUATION_FILE
    if not os.path.lexists(path):
        raise RunDirError(f"{out} has no saved evaluation ({EVALUATION_FILE}): run `fedgmr evaluate {out} --save` "
                          f"where its checkpoint is")
    try:
        body = json.loads(read_run_text(path))
        if not isinstance(body, dict) or body.get("format") != EVALUATION_FORMAT:
            raise ValueError("format")
        fields = {k: body[k] for k in ("step", "time", "final", "accuracy", "loss", "levels", "level_accuracy")}
        result = RunEvaluation(run=str(out), step=int(fields["step"]), time=float(fields["time"]),
                               final=bool(fields["final"]), accuracy=float(fields["accuracy"]),
                               loss=float(fields["loss"]), levels=[float(d) for d in fields["levels"]],
                               level_accuracy=[float(a) for a in fields["level_accuracy"]],
                               class_accuracy=_class_list(body.get("class_accuracy", [])),
                               level_class_accuracy=[_class_list(row) for row in body.get("level_class_accuracy", [])])
        if len(result.levels) != len(result.level_accuracy):
            raise ValueError("levels")
        if (result.class_accuracy or result.level_class_accuracy) and (
                not result.class_accuracy or len(result.level_class_accuracy) != len(result.levels)
                or any(len(row) != len(result.class_accuracy) for row in result.level_class_accuracy)):
            raise ValueError("level_class_accuracy")  # one row per level, each as long as the full model's
    except RunDirError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        raise RunDirError(f"{path} is damaged (not an evaluation saved by fedgmr evaluate --save): restore it, or "
                          f"evaluate the run again with --save") from None
    if (out / CONFIG_FILE).is_file():
        try:
            raw = read_config_file(out / CONFIG_FILE)
        except ConfigError as exc:
            raise RunDirError(f"{out} cannot be read: {exc}") from None
        if config_digest(raw) != body.get("config_sha256"):
            raise RunDirError(f"{out / CONFIG_FILE} was changed after {EVALUATION_FILE} was saved (its hash does "
                              f"not match): the saved evaluation is of another experiment; restore the config")
    return result


def _class_list(values: Any) -> list[float | None]:
    """A saved per-class accuracy list (numbers, or null for a class the test split lacks)."""
    if not isinstance(values, list):
        raise ValueError("class accuracy")
    return [None if v is None else float(v) for v in values]


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


def evaluate_run(run_dir: str | Path, levels: bool = True, save: bool = False,
                 classes: bool = False) -> RunEvaluation:
    """Evaluate the global model of ``run_dir``'s checkpoint (see the module docstring);
    with ``save``, also keep the result in the run directory (:func:`save_evaluation`);
    with ``classes``, also each class's accuracy, in full and (with ``levels``) per level.

    Raises ``RunDirError`` for a directory without a config or a checkpoint, and for
    ``classes`` on a task that is not classification."""
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
    if classes:  # the per-class report a run logs with run.class_eval_every (evaluation only: nothing trains)
        raw["run"]["class_eval_every"] = 1
    try:
        cfg = resolve_config(raw)
    except ConfigError as exc:
        raise RunDirError(f"{config_path}: {exc}") from None
    try:
        exp = build_experiment(cfg)
    except ConfigError as exc:
        if classes and "class_eval_every" in str(exc):  # the task has no classes (or no global model)
            raise RunDirError(f"{out}: --classes measures each class's accuracy of the global model, which this "
                              f"run has not: {exc}") from None
        raise
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
        class_acc: list[float | None] = []
        level_class_acc: list[list[float | None]] = []
        if classes:
            report = exp.simulator.diagnostics.class_report if exp.simulator.diagnostics is not None else None
            if report is None:  # pragma: no cover - build_experiment refuses the tasks without one, above
                raise RunDirError(f"{out}: no per-class report for this run's task")
            class_acc = list(report(params, buffers)["class_accuracy"])
            level_class_acc = [list(report(params * strategy.policy.mask(i).to(params.dtype), buffers)
                                    ["class_accuracy"]) for i in range(len(ladder))]
        sim = state.get("simulator", {})
        final = _summary_steps(out / SUMMARY_FILE) == step
        result = RunEvaluation(str(out), step, float(sim.get("now", 0.0)), final, float(acc), float(loss),
                               [float(d) for d in ladder], [float(a) for a in per_level], class_acc, level_class_acc)
        if save:
            from fedgmr.experiment.environment import environment

            save_evaluation(result, out, str(state.get("config_sha256")), environment(cfg.run.device))
        return result
    finally:
        exp.executor.close()


__all__ = ["EVALUATION_FILE", "RunEvaluation", "evaluate_run", "level_labels", "load_evaluation", "save_evaluation"]
