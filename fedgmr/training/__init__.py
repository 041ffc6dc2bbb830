"""Client-side computation: masked local training and evaluation (runtime-agnostic)."""

from fedgmr.training.local import TrainOutcome, TrainSettings, masked_local_training
from fedgmr.training.evaluate import evaluate

__all__ = ["TrainSettings", "TrainOutcome", "masked_local_training", "evaluate"]
