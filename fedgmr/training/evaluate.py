"""Accuracy and loss of a model on a data set (token accuracy ignores padding)."""

from __future__ import annotations

import torch
import torch.nn as nn

from fedgmr.device import module_device
from fedgmr.algorithm.losses import task_loss


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, task: str = "classification",
             pad_index: int | None = None, batch_size: int = 512) -> tuple[float, float]:
    """Return (top-1 accuracy, mean loss). For ``next_token`` tasks both are per
    non-padding token. Batches move to the model's device one at a time."""
    was_training = model.training
    model.eval()
    device = module_device(model)
    correct, count, loss_sum = 0, 0, 0.0
    for start in range(0, len(y), batch_size):
        xb, yb = x[start:start + batch_size].to(device), y[start:start + batch_size].to(device)
        logits = model(xb)
        loss_sum += float(task_loss(logits, yb, task, "ce", pad_index, reduction="sum"))
        pred = logits.argmax(-1)
        if task == "next_token" and pad_index is not None:
            keep = yb != pad_index
            correct += int(((pred == yb) & keep).sum())
            count += int(keep.sum())
        else:
            correct += int((pred == yb).sum())
            count += int(yb.numel())
    model.train(was_training)
    if count == 0:
        return 0.0, 0.0
    return correct / count, loss_sum / count


@torch.no_grad()
def class_report(model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int,
                 batch_size: int = 512) -> dict[str, list]:
    """Per-class accuracy and what the model predicts, on a classification split.

    ``class_accuracy[c]``: the share of class-``c`` samples predicted as ``c`` (None when
    the split holds none); ``predicted_share[c]``: the share of all samples predicted as
    ``c``. A model biased toward some clients' classes under label skew shows here."""
    was_training = model.training
    model.eval()
    device = module_device(model)
    hits = torch.zeros(num_classes, dtype=torch.long)
    counts = torch.zeros(num_classes, dtype=torch.long)
    predicted = torch.zeros(num_classes, dtype=torch.long)
    for start in range(0, len(y), batch_size):
        xb, yb = x[start:start + batch_size].to(device), y[start:start + batch_size]
        pred = model(xb).argmax(-1).cpu()
        counts += torch.bincount(yb, minlength=num_classes)[:num_classes]
        predicted += torch.bincount(pred, minlength=num_classes)[:num_classes]
        hits += torch.bincount(yb[pred == yb], minlength=num_classes)[:num_classes]
    model.train(was_training)
    total = max(int(counts.sum()), 1)
    return {"class_accuracy": [int(h) / int(n) if n else None for h, n in zip(hits, counts)],
            "predicted_share": [int(k) / total for k in predicted]}
