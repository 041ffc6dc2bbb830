"""Clustered FL: one model per cluster on the server (``clustering``)."""

from __future__ import annotations

from pydantic import Field

from fedgmr.config.base import Section


class ClusteringConfig(Section):
    """Clustered FL: one model per cluster on the server (fedgmr.strategy.clustered;
    docs/methods/ifca.md, docs/methods/cfl.md).

    kind: ``none``, ``ifca`` (k models, each client takes the one with the lowest loss on
        its data) or ``cfl`` (Sattler et al.'s bipartitioning; synchronous only).
    k: IFCA's number of cluster models (4: IFCA's rotated-MNIST setting).
    eps1, eps2: CFL splits a cluster when the norm of its mean update is below ``eps1``
        and its largest update norm above ``eps2`` (0.4 and 1.6: Sattler's reference code).
    min_size: CFL splits only clusters of more than this many clients (reference: 2).
    warmup: CFL splits nothing in rounds 1..warmup (reference: 20).
    loss_samples: IFCA scores the k models on the first this many samples of a client's
        training shard (null: all of it, as the paper; a cap makes each job cheaper).
    """

    kind: str = "none"
    k: int = Field(4, ge=1)
    eps1: float = Field(0.4, gt=0)
    eps2: float = Field(1.6, gt=0)
    min_size: int = Field(2, ge=1)
    warmup: int = Field(20, ge=0)
    loss_samples: int | None = Field(None, ge=1)
