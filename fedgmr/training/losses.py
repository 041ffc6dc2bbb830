"""The task losses (re-exported: they live in :mod:`fedgmr.algorithm.losses`, pure math
the algorithm's own modules use without importing training)."""

from fedgmr.algorithm.losses import task_loss

__all__ = ["task_loss"]
