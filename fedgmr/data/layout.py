"""Client data held once: the training rows laid out in client order.

A partition names each client's samples by index arrays into the training set, and
gathering them (``x[idx]``) copies every shard beside the data set that still holds
them. :func:`client_ordered` lays the training rows out once, in client order (client 0's
training samples, client 1's, ..., then the clients' validation and test samples, the
server's validation split and the rows no one uses), and renumbers the partition to
match, so that each group is a contiguous range of rows; :func:`rows` then hands out a
range as a *view* of that one storage. A shard holds the same samples in the same order
as before, so training sees the same batches and every metric is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import overload

import numpy as np
import torch

from fedgmr.data.base import ArrayDataset, FederatedData
from fedgmr.data.partition import Partition


def _range(idx: np.ndarray) -> tuple[int, int] | None:
    """``(start, stop)`` when ``idx`` is ``start, start + 1, ..., stop - 1`` (empty: (0, 0))."""
    idx = np.asarray(idx)
    if idx.size == 0:
        return 0, 0
    start, stop = int(idx[0]), int(idx[-1]) + 1
    if stop - start != idx.size or (idx.size > 1 and not bool(np.all(np.diff(idx) == 1))):
        return None
    return start, stop


def rows(t: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
    """``t[idx]``: a view of ``t`` when ``idx`` is a contiguous ascending range, else a copy
    (the same values either way)."""
    span = _range(idx)
    if span is not None:
        return t[span[0]:span[1]]
    return t[torch.as_tensor(np.asarray(idx), dtype=torch.long)]


class ClientShards(Sequence[tuple[torch.Tensor, torch.Tensor]]):
    """Each client's ``(x, y)`` as views of one pair of tensors: ``shards[i]`` is
    ``(x[a:b], y[a:b])`` for client ``i``'s range ``bounds[i] = (a, b)``.

    A list of views would pickle the whole storage once per view (a tensor pickles its
    storage, and a view's storage is the whole data set); this pickles ``x`` and ``y``
    once, with the ranges, and rebuilds the views on the other side - one copy of the
    data in a worker that is sent the workload (``spawn``, Ray), shared memory under
    torch's multiprocessing pickler.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, bounds: Sequence[tuple[int, int]]) -> None:
        self.x, self.y = x, y
        self.bounds = [(int(a), int(b)) for a, b in bounds]
        self._views = [(x[a:b], y[a:b]) for a, b in self.bounds]

    def __len__(self) -> int:
        return len(self._views)

    @overload
    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    @overload
    def __getitem__(self, i: slice) -> list[tuple[torch.Tensor, torch.Tensor]]: ...

    def __getitem__(self, i: int | slice) -> "tuple[torch.Tensor, torch.Tensor] | list[tuple[torch.Tensor, torch.Tensor]]":
        return self._views[i]

    def __reduce__(self) -> tuple[type, tuple[torch.Tensor, torch.Tensor, list[tuple[int, int]]]]:
        return ClientShards, (self.x, self.y, self.bounds)

    def __repr__(self) -> str:
        return f"ClientShards({len(self)} clients, {tuple(self.x.shape)} rows)"


def shards(x: torch.Tensor, y: torch.Tensor,
           groups: Sequence[np.ndarray]) -> "ClientShards | list[tuple[torch.Tensor, torch.Tensor]]":
    """``[(x[g], y[g]) for g in groups]``: views of ``x`` and ``y`` (a :class:`ClientShards`)
    when every group is a contiguous range of rows, else copies, as a list."""
    spans = [_range(g) for g in groups]
    if all(s is not None for s in spans):
        return ClientShards(x, y, spans)  # type: ignore[arg-type]
    return [(rows(x, g), rows(y, g)) for g in groups]


def _groups(partition: Partition) -> list[np.ndarray]:
    return [*partition.clients, *partition.client_val, *partition.client_test, partition.server_val]


def is_client_ordered(partition: Partition) -> bool:
    """Whether every group of ``partition`` is a contiguous range of rows."""
    return all(_range(g) is not None for g in _groups(partition))


def client_ordered(data: FederatedData, partition: Partition) -> tuple[FederatedData, Partition]:
    """``data`` with its training rows in client order and ``partition`` renumbered to match.

    The new data set's row ``i`` is the old row ``order[i]`` (kept as ``meta["row_order"]``);
    its natural clients are renumbered too, and the test split is shared. ``data`` itself
    is not changed (a caller may reuse it), and once nothing else holds it the old layout
    is freed: the run keeps one copy of its training data. Returned as they are when the
    partition's groups overlap (a sample in two groups) or already are ranges.
    """
    groups = _groups(partition)
    if all(_range(g) is not None for g in groups):
        return data, partition
    n = len(data.train)
    used = np.concatenate([np.asarray(g, dtype=np.int64) for g in groups]) if groups else np.zeros(0, np.int64)
    seen = np.zeros(n, dtype=bool)
    seen[used] = True
    if int(seen.sum()) != used.size:  # a row in two groups: it cannot sit in two ranges
        return data, partition
    order = np.concatenate([used, np.flatnonzero(~seen)]).astype(np.int64)
    new_pos = np.empty(n, dtype=np.int64)
    new_pos[order] = np.arange(n, dtype=np.int64)

    def renumber(g: np.ndarray) -> np.ndarray:
        return new_pos[np.asarray(g, dtype=np.int64)]

    sel = torch.from_numpy(order)
    train = ArrayDataset(data.train.x[sel], data.train.y[sel])
    natural = None if data.natural_clients is None else [renumber(u) for u in data.natural_clients]
    meta = {**data.meta, "row_order": order}
    new_part = Partition([renumber(g) for g in partition.clients], [renumber(g) for g in partition.client_val],
                         renumber(partition.server_val), [renumber(g) for g in partition.client_test])
    return replace(data, train=train, natural_clients=natural, meta=meta), new_part


def loaded_layout(data: FederatedData) -> tuple[np.ndarray, list[np.ndarray] | None]:
    """The training labels and natural clients in the loaded data set's row order (as
    :func:`client_ordered` found them), so that partitioning a client-ordered data set
    draws the same partition as partitioning the loaded one."""
    labels = data.train.y.numpy()
    order = data.meta.get("row_order")
    if order is None:
        return labels, data.natural_clients
    new_pos = np.empty(len(order), dtype=np.int64)
    new_pos[order] = np.arange(len(order), dtype=np.int64)
    natural = None if data.natural_clients is None else [order[np.asarray(u, dtype=np.int64)]
                                                         for u in data.natural_clients]
    return labels[new_pos], natural


def in_current_layout(partition: Partition, data: FederatedData) -> Partition:
    """``partition`` (indices into the loaded row order) renumbered to ``data``'s rows."""
    order = data.meta.get("row_order")
    if order is None:
        return partition
    new_pos = np.empty(len(order), dtype=np.int64)
    new_pos[order] = np.arange(len(order), dtype=np.int64)
    return Partition([new_pos[g] for g in partition.clients], [new_pos[g] for g in partition.client_val],
                     new_pos[partition.server_val], [new_pos[g] for g in partition.client_test])


__all__ = ["in_current_layout", "loaded_layout", "ClientShards", "client_ordered", "is_client_ordered", "rows", "shards"]
