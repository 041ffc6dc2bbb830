"""Accuracy and average density against virtual time, as PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_runs(runs: Sequence[tuple[str, Sequence[dict[str, Any]]]], path: str | Path,
              title: str | None = None, t_star: float | None = None) -> Path:
    """One figure: test accuracy (left axis, solid) and average density (right axis,
    dashed) against virtual time, one colour per run."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=120)
    ax2 = ax.twinx()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, rows) in enumerate(runs):
        c = colors[i % len(colors)]
        t = [r["time"] for r in rows]
        ax.plot(t, [100 * r["accuracy"] for r in rows], color=c, lw=1.6, label=label)
        ax2.plot(t, [r["avg_density"] for r in rows], color=c, lw=1.1, ls="--", alpha=0.8)
    if t_star is not None:
        ax.axvline(t_star, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("test accuracy (%)")
    ax2.set_ylabel("average density (dashed)")
    ax2.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
