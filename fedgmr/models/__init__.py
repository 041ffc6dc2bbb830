"""Models: a registry of builders, one width-scalable definition per architecture."""

from fedgmr.models.registry import MODELS, build_model, scaled
from fedgmr.models import vision as _vision  # noqa: F401  (registers mlp, cnn, conv2)
from fedgmr.models import vgg as _vgg  # noqa: F401
from fedgmr.models import resnet as _resnet  # noqa: F401
from fedgmr.models import transformer as _transformer  # noqa: F401
from fedgmr.models import char as _char  # noqa: F401
from fedgmr.models import rep as _rep  # noqa: F401  (rep_cnn: FedMRL's representation models)

__all__ = ["MODELS", "build_model", "scaled"]
