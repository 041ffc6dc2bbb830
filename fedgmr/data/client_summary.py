"""What each client holds: sample counts and label shares of a partition (pure functions).

A partition decides much of what a federated run can learn: under Dirichlet(0.1) skew a
client may hold one class, and when that client is also the only one that trains some
coordinates, the model is its model there. :func:`summarise_clients` counts, per client,
its training samples, validation samples and, for a classification task, each label;
:func:`format_client_table` prints them as a Markdown table, :func:`client_csv` as CSV.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedgmr.data.partition import Partition


@dataclass(frozen=True)
class ClientSummary:
    """One client's share of a partition.

    ``label_counts[c]``: the client's training samples of class ``c``; ``None`` where a
    sample has no single label (a ``next_token`` task's target sequences)."""

    client: int
    samples: int
    val_samples: int
    test_samples: int
    label_counts: np.ndarray | None

    def label_shares(self) -> list[tuple[int, float]]:
        """``(class, share of the client's samples)``, largest first (ties: lower class
        first), classes the client does not hold left out."""
        if self.label_counts is None or self.samples == 0:
            return []
        order = sorted(range(len(self.label_counts)), key=lambda c: (-int(self.label_counts[c]), c))
        return [(c, int(self.label_counts[c]) / self.samples) for c in order if self.label_counts[c] > 0]

    def labels_at_least(self, share: float) -> int:
        """How many classes each make up at least ``share`` of the client's samples."""
        return sum(1 for _, s in self.label_shares() if s >= share)


def summarise_clients(labels: np.ndarray, partition: Partition, num_classes: int | None = None
                      ) -> list[ClientSummary]:
    """Per-client counts of ``partition`` (indices into the rows ``labels`` describes).

    ``labels``: one class per training sample (1-D), or any 2-D targets (sequences), for
    which only the sample counts are given. ``num_classes``: the length of each count
    vector (default: the largest label + 1)."""
    labels = np.asarray(labels)
    per_sample = labels.ndim == 1
    if per_sample and len(labels):
        if labels.min() < 0:
            raise ValueError("labels must be non-negative class indices")
        width = int(labels.max()) + 1 if num_classes is None else int(num_classes)
        if int(labels.max()) >= width:
            raise ValueError(f"a label {int(labels.max())} is outside the {width} classes")
    else:
        width = 0 if num_classes is None else int(num_classes)
    out = []
    for i, idx in enumerate(partition.clients):
        idx = np.asarray(idx, dtype=np.int64)
        counts = np.bincount(labels[idx], minlength=width) if per_sample else None
        val = len(partition.client_val[i]) if i < len(partition.client_val) else 0
        test = len(partition.client_test[i]) if i < len(partition.client_test) else 0
        out.append(ClientSummary(i, len(idx), val, test, counts))
    return out


def _share(share: float) -> str:
    return f"{share * 100:.0f} %" if share >= 0.005 else "<1 %"


def format_client_table(summaries: Sequence[ClientSummary], densities: Sequence[float] | None = None,
                        top: int = 3, threshold: float = 0.05) -> str:
    """A Markdown table: client, its start density (``densities``, if given), samples,
    validation samples, the number of classes with at least ``threshold`` of its samples,
    and its ``top`` largest label shares."""
    labelled = any(s.label_counts is not None for s in summaries)
    head = ["client"] + (["start density"] if densities is not None else []) + ["samples", "val"]
    if labelled:
        head += [f"labels ≥ {threshold * 100:.0f} %", f"largest label shares (class: share, top {top})"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for s in summaries:
        row = [str(s.client)] + ([f"{densities[s.client]:g}"] if densities is not None else [])
        row += [f"{s.samples:,}", f"{s.val_samples:,}"]
        if labelled:
            shares = s.label_shares()[:top]
            row += [str(s.labels_at_least(threshold)), ", ".join(f"{c}: {_share(v)}" for c, v in shares) or "—"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def client_csv(summaries: Sequence[ClientSummary], densities: Sequence[float] | None = None) -> str:
    """CSV, one row per client: client, start_density (if given), samples, val_samples,
    test_samples, then one column of counts per class (``label_0``, ``label_1``, ...)."""
    width = max((len(s.label_counts) for s in summaries if s.label_counts is not None), default=0)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["client"] + (["start_density"] if densities is not None else [])
                    + ["samples", "val_samples", "test_samples"] + [f"label_{c}" for c in range(width)])
    for s in summaries:
        counts = [] if s.label_counts is None else [int(v) for v in s.label_counts]
        writer.writerow([s.client] + ([densities[s.client]] if densities is not None else [])
                        + [s.samples, s.val_samples, s.test_samples] + counts)
    return buf.getvalue()


__all__ = ["ClientSummary", "client_csv", "format_client_table", "summarise_clients"]
