"""Data set registry: ``name -> loader(root=None, **options) -> FederatedData``."""

from __future__ import annotations

from typing import Callable

from fedgmr.data.base import FederatedData
from fedgmr.errors import DatasetFormatError, FedGMRError
from fedgmr.registry import Registry

DatasetLoader = Callable[..., FederatedData]
DATASETS: Registry[DatasetLoader] = Registry("dataset")


def load_dataset(name: str, root: str | None = None, **options) -> FederatedData:
    """Load a registered data set by name.

    An option the loader does not take is a :class:`~fedgmr.errors.ConfigError` naming it;
    a loader that raises anything but a FedGMR error (a registered loader of yours with a
    bug, say) is a one-line :class:`~fedgmr.errors.DatasetFormatError` naming the data
    set and the exception (chained, for its traceback)."""
    from fedgmr.options import check_option_names

    loader = DATASETS.get(name)
    check_option_names("data", "dataset", name, loader, options, reserved=("root",))
    try:
        return loader(root=root, **options)
    except FedGMRError:
        raise
    except Exception as exc:  # noqa: BLE001 - your loader's error becomes one line
        first = (str(exc).splitlines() or [""])[0].strip()
        raise DatasetFormatError(f"data set {name!r}: its loader raised {type(exc).__name__}"
                                 + (f": {first[:300]}" if first else "")) from exc
