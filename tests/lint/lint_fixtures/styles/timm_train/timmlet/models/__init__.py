from . import resnet  # noqa: F401  (importing the module registers its models)
from ._factory import create_model
from ._registry import is_model, is_model_pretrained, list_models, model_entrypoints, register_model

__all__ = ["create_model", "is_model", "is_model_pretrained", "list_models", "model_entrypoints", "register_model"]
