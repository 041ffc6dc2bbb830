"""The Flower ClientApp: ``clientapp = "fedgmr.flower.client_app:app"``.

Trains the masked sub-model each train message carries and replies with the sparse
payload (see :mod:`fedgmr.flower.client`). A node whose config sets ``fedgmr-fault``
misbehaves on purpose (:mod:`fedgmr.flower.faults`) - for tests and drills only.
"""

from __future__ import annotations

from fedgmr.flower.adapter import make_client_app
from fedgmr.flower.client import train_handler
from fedgmr.flower.faults import fault_mod

app = make_client_app(train_handler, mods=[fault_mod])
