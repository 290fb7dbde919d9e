"""create_model: a registered model by name."""

from ._registry import is_model, model_entrypoint


def create_model(model_name, pretrained=False, **kwargs):
    if not is_model(model_name):
        raise RuntimeError(f"unknown model {model_name!r}")
    create_fn = model_entrypoint(model_name)
    return create_fn(pretrained=pretrained, **kwargs)
