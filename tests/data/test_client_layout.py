"""Client data held once: every client's shard is a view of the run's one copy of the
training rows (fedgmr.data.layout), with the same samples in the same order as gathering
them from the loaded data set."""

from __future__ import annotations

import copy
import io
import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch

import torch.multiprocessing  # noqa: F401 - registers torch's reductions on ForkingPickler
from conftest import tiny_config
from fedgmr.data import load_dataset
from fedgmr.data.layout import ClientShards, client_ordered, is_client_ordered, rows, shards
from fedgmr.experiment.build import build_experiment, client_partition, client_splits
from fedgmr.methods import resolve_config
from fedgmr.sim.executors import _own_model


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


@pytest.fixture(scope="module")
def built():
    cfg = resolve_config(tiny_config(data={"name": "digits", "partition": "dirichlet", "alpha": 0.5,
                                           "client_val_fraction": 0.2, "client_test_fraction": 0.2},
                                     run={"max_steps": 2, "personal_eval_every": 1, "client_eval_every": 1}))
    return cfg, build_experiment(cfg)


def test_every_shard_is_a_view_of_the_experiments_one_copy(built):
    _, exp = built
    w = exp.simulator.executor.workload
    base_x, base_y = _storage(exp.data.train.x), _storage(exp.data.train.y)
    for split in (w.client_data, w.client_val):
        assert isinstance(split, ClientShards)
        assert all(_storage(x) == base_x and _storage(y) == base_y for x, y in split)
    assert is_client_ordered(exp.partition)


def test_shards_hold_the_loaded_samples_in_the_partitions_order(built):
    """The same values, batch for batch: the shard of client i is the loaded data set's
    rows partition.clients[i] (of the partition made from the loaded layout)."""
    cfg, exp = built
    loaded = load_dataset(cfg.data.name, root=cfg.data.root, **cfg.data.options)
    part = client_partition(cfg, loaded)
    old = client_splits(cfg, loaded, part)  # gathered copies, as before
    w = exp.simulator.executor.workload
    for new_split, old_split in ((w.client_data, old.train), (w.client_val, old.val)):
        assert len(new_split) == len(old_split)
        for (nx, ny), (ox, oy) in zip(new_split, old_split):
            assert torch.equal(nx, ox) and torch.equal(ny, oy) and nx.is_contiguous()
    # the renumbered partition names the same samples in the client-ordered rows
    order = exp.data.meta["row_order"]
    for new_idx, old_idx in zip(exp.partition.clients, part.clients):
        assert np.array_equal(order[new_idx], old_idx)
    assert np.array_equal(order[exp.partition.server_val], part.server_val)


def test_client_ordered_leaves_the_callers_data_alone_and_is_idempotent():
    data = load_dataset("digits")
    x0 = data.train.x.clone()
    cfg = resolve_config(tiny_config(data={"name": "digits", "partition": "iid"}))
    part = client_partition(cfg, data)
    ordered, new_part = client_ordered(data, part)
    assert torch.equal(data.train.x, x0) and "row_order" not in data.meta
    assert ordered.train.x.shape == data.train.x.shape  # every row kept, unused ones at the end
    again, again_part = client_ordered(ordered, new_part)
    assert again is ordered and again_part is new_part


def test_overlapping_groups_are_left_as_copies():
    x, y = torch.arange(10.0).reshape(5, 2), torch.arange(5)
    groups = [np.array([0, 2]), np.array([1, 2])]  # row 2 in both
    out = shards(x, y, groups)
    assert isinstance(out, list) and torch.equal(out[1][0], x[[1, 2]])
    assert _storage(rows(x, np.array([1, 2, 3]))) == _storage(x)  # a range is a view
    assert _storage(rows(x, np.array([3, 1]))) != _storage(x)


def test_shards_pickle_the_storage_once_not_once_per_client():
    """A view pickles its whole storage; ClientShards sends the rows once with the ranges."""
    x, y = torch.randn(1000, 8), torch.arange(1000)
    s = ClientShards(x, y, [(i, i + 10) for i in range(0, 1000, 10)])
    blob = pickle.dumps(s)
    assert len(blob) < 2 * (x.nbytes + y.nbytes)
    back = pickle.loads(blob)
    assert len(back) == 100 and all(_storage(bx) == _storage(back.x) for bx, _ in back)
    assert torch.equal(back[7][0], x[70:80])
    buf = io.BytesIO()
    ForkingPickler(buf).dump(s)  # the spawn path: shared memory, no bytes of the data
    assert len(buf.getvalue()) < 100_000


def test_a_workers_private_copy_shares_the_client_data(built):
    _, exp = built
    w = exp.simulator.executor.workload
    own = _own_model(w)
    assert own.client_data is w.client_data and own.model is not w.model
    assert copy.deepcopy(w.client_data)[0][0].untyped_storage().data_ptr() != _storage(w.client_data[0][0])


def test_partitioning_the_experiments_data_gives_the_experiments_partition(built):
    """client_partition(cfg, exp.data) on the client-ordered rows draws the run's partition."""
    cfg, exp = built
    again = client_partition(cfg, exp.data)
    for a, b in ((again.clients, exp.partition.clients), (again.client_val, exp.partition.client_val),
                 (again.client_test, exp.partition.client_test)):
        assert len(a) == len(b) and all(np.array_equal(u, v) for u, v in zip(a, b))
    assert np.array_equal(again.server_val, exp.partition.server_val)
