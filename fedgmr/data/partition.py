"""Client partitions (IID, Dirichlet label skew, label-sorted shards, natural) and the validation split.

All functions are pure given a ``numpy.random.Generator`` (the *partition* stream).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedgmr.errors import ConfigError, DatasetFormatError


@dataclass
class Partition:
    """Index arrays into the training set.

    ``clients[i]`` are client ``i``'s training samples, ``client_val[i]`` its own
    validation samples (empty unless per-client validation was requested) and
    ``server_val`` the held-out validation split that GMR monitors; ``client_test[i]``
    client ``i``'s own test split (personalised evaluation; empty unless requested).
    """

    clients: list[np.ndarray]
    client_val: list[np.ndarray]
    server_val: np.ndarray
    client_test: list[np.ndarray] = field(default_factory=list)


def split_validation(num_samples: int, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Return (train_indices, validation_indices) with ``fraction`` held out."""
    if not 0.0 <= fraction < 1.0:
        raise ConfigError(f"data.val_fraction must be in [0, 1), got {fraction}")
    perm = rng.permutation(num_samples)
    n_val = int(round(num_samples * fraction))
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def iid_partition(indices: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle and deal ``indices`` into ``num_clients`` near-equal shards."""
    if num_clients > len(indices):
        raise ConfigError(f"cannot split {len(indices)} samples over {num_clients} clients")
    perm = rng.permutation(indices)
    return [np.sort(shard) for shard in np.array_split(perm, num_clients)]


def dirichlet_partition(indices: np.ndarray, labels: np.ndarray, num_clients: int, alpha: float,
                        rng: np.random.Generator, min_size: int = 2, max_tries: int = 100) -> list[np.ndarray]:
    """Label-skewed split: each class is spread over clients by a Dirichlet(alpha) draw.

    Redraws until every client holds at least ``min_size`` samples.
    """
    if alpha <= 0:
        raise ConfigError(f"data.alpha must be > 0, got {alpha}")
    if num_clients * min_size > len(indices):
        raise ConfigError(f"cannot split {len(indices)} samples over {num_clients} clients")
    labels = np.asarray(labels)
    classes = np.unique(labels[indices])
    for _ in range(max_tries):
        shards: list[list[int]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(indices[labels[indices] == c])
            props = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(props) * len(idx)).astype(int)[:-1]
            for shard, part in zip(shards, np.split(idx, cuts)):
                shard.extend(part.tolist())
        if min(len(s) for s in shards) >= min_size:
            return [np.sort(np.asarray(s, dtype=np.int64)) for s in shards]
    raise ConfigError(
        f"Dirichlet(alpha={alpha}) left a client with fewer than {min_size} samples after "
        f"{max_tries} draws; use fewer clients or a larger alpha"
    )


def shards_partition(indices: np.ndarray, labels: np.ndarray, num_clients: int, shards_per_client: int,
                     rng: np.random.Generator) -> list[np.ndarray]:
    """Pathological label skew (McMahan et al., 2017): sort by label, cut into
    ``num_clients * shards_per_client`` equal shards, deal each client ``shards_per_client``
    of them at random. A client holds at most ``shards_per_client`` classes (fewer when two
    of its shards share one)."""
    if shards_per_client < 1:
        raise ConfigError(f"data.shards_per_client must be >= 1, got {shards_per_client}")
    num_shards = num_clients * shards_per_client
    if num_shards > len(indices):
        raise ConfigError(f"cannot cut {len(indices)} samples into {num_shards} shards "
                          f"({num_clients} clients x {shards_per_client})")
    labels = np.asarray(labels)
    shuffled = rng.permutation(indices)  # random order within a class
    by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
    shards = np.array_split(by_label, num_shards)
    order = rng.permutation(num_shards)
    return [np.sort(np.concatenate([shards[j] for j in order[i * shards_per_client:(i + 1) * shards_per_client]]))
            for i in range(num_clients)]


def make_partition(labels: np.ndarray, num_clients: int, scheme: str, rng: np.random.Generator,
                   alpha: float = 0.6, val_fraction: float = 0.1, client_val_fraction: float = 0.0,
                   natural: list[np.ndarray] | None = None, client_test_fraction: float = 0.0,
                   shards_per_client: int = 2) -> Partition:
    """Carve the server validation split, then split the rest over clients.

    ``scheme`` is ``iid``, ``dirichlet``, ``shards`` (``shards_per_client`` label-sorted
    shards each) or ``natural`` (``natural`` needs the data set's own client split; its
    clients are grouped round-robin into ``num_clients`` clients when there are more
    natural users than clients).
    """
    labels = np.asarray(labels)
    if scheme == "natural":
        if natural is None:
            raise ConfigError("data.partition 'natural' needs a data set with natural clients")
        groups: list[list[np.ndarray]] = [[] for _ in range(min(num_clients, len(natural)))]
        if len(natural) < num_clients:
            raise ConfigError(f"the data set has {len(natural)} natural clients, fewer than {num_clients}")
        for i, user in enumerate(natural):
            user = np.asarray(user, dtype=np.int64)
            if user.size == 0 or user.min() < 0 or user.max() >= len(labels):
                # the built-in loaders drop users without training samples; a custom loader must too
                what = "has no sample" if user.size == 0 else f"indexes outside the {len(labels)} training samples"
                raise DatasetFormatError(f"natural client #{i} of the data set {what}; every natural client must "
                                         "list at least one training-sample index")
            groups[i % num_clients].append(user)
        pooled = [np.concatenate(g) for g in groups]
        server_val_parts, clients = [], []
        for shard in pooled:
            keep, val = split_validation(len(shard), val_fraction, rng)
            clients.append(shard[keep])
            server_val_parts.append(shard[val])
        server_val = np.sort(np.concatenate(server_val_parts))
    else:
        train_idx, server_val = split_validation(len(labels), val_fraction, rng)
        if scheme == "iid":
            clients = iid_partition(train_idx, num_clients, rng)
        elif scheme == "dirichlet":
            clients = dirichlet_partition(train_idx, labels, num_clients, alpha, rng)
        elif scheme == "shards":
            clients = shards_partition(train_idx, labels, num_clients, shards_per_client, rng)
        else:
            raise ConfigError(f"data.partition must be 'iid', 'dirichlet', 'shards' or 'natural', got {scheme!r}")
    client_val: list[np.ndarray] = []
    if client_val_fraction > 0:
        split_clients = []
        for shard in clients:
            keep, val = split_validation(len(shard), client_val_fraction, rng)
            split_clients.append(shard[keep])
            client_val.append(shard[val])
        clients = split_clients
    else:
        client_val = [np.zeros(0, dtype=np.int64) for _ in clients]
    # after everything else, so that a run without client test splits draws as before
    client_test: list[np.ndarray] = [np.zeros(0, dtype=np.int64) for _ in clients]
    if client_test_fraction > 0:
        split_clients = []
        for i, shard in enumerate(clients):
            keep, test = split_validation(len(shard), client_test_fraction, rng)
            if len(keep) == 0:
                raise ConfigError(f"data.client_test_fraction {client_test_fraction} leaves client {i} no training "
                                  f"sample ({len(shard)} in its shard)")
            split_clients.append(shard[keep])
            client_test[i] = shard[test]
        clients = split_clients
    return Partition(clients=clients, client_val=client_val, server_val=server_val, client_test=client_test)
