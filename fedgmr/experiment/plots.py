"""Accuracy and average density against virtual time, as PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fedgmr.errors import ConfigError, FedGMRError  # noqa: E402


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
    try:
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path


def check_plot_path(path: str | Path, option: str = "--out") -> Path:
    """Refuse, before any work, an output path a plot cannot be written to: an unknown
    image format (:class:`ConfigError`, naming ``option``), a missing or unwritable folder, or
    a folder in place of the file (:class:`FedGMRError`)."""
    path = Path(path)
    formats = plt.figure().canvas.get_supported_filetypes()
    plt.close("all")
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in formats:
        raise ConfigError(f"invalid value for '{option}': {str(path)!r} must end in an image format "
                          f"({', '.join('.' + f for f in sorted(formats))}), e.g. .png")
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise FedGMRError(f"cannot write plot {path}: it is a directory")
    if not parent.is_dir():
        why = "is a file, not a folder" if parent.exists() else "does not exist"
        raise FedGMRError(f"cannot write plot {path}: folder {parent} {why}")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise FedGMRError(f"cannot write plot {path}: permission denied")
    return path


def write_plot(runs: Sequence[tuple[str, Sequence[dict[str, Any]]]], path: str | Path, option: str = "--out",
               title: str | None = None, t_star: float | None = None) -> Path:
    """:func:`plot_runs` for the command line: any failure to write is one ``FedGMRError`` line."""
    path = check_plot_path(path, option)
    try:
        return plot_runs(runs, path, title=title, t_star=t_star)
    except OSError as exc:
        raise FedGMRError(f"cannot write plot {path}: {exc.strerror or exc}") from None
