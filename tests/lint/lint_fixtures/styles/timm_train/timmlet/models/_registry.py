"""The model registry: @register_model adds a constructor under its function name."""

import fnmatch
import re
import sys
from collections import defaultdict

_module_to_models = defaultdict(set)  # module name -> names of the models it defines
_model_to_module = {}  # model name -> module name
_model_entrypoints = {}  # model name -> constructor, in the order the decorators ran
_model_has_pretrained = set()  # names of the models with pretrained weights


def register_model(fn):
    mod = sys.modules[fn.__module__]
    module_name = fn.__module__.split(".")[-1]
    model_name = fn.__name__
    if hasattr(mod, "__all__"):
        mod.__all__.append(model_name)
    else:
        mod.__all__ = [model_name]
    _model_entrypoints[model_name] = fn
    _model_to_module[model_name] = module_name
    _module_to_models[module_name].add(model_name)
    if getattr(fn, "pretrained_url", ""):
        _model_has_pretrained.add(model_name)
    return fn


def _natural_key(string_):
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", string_.lower())]


def list_models(filter="", module="", pretrained=False, exclude_filters=()):
    """Registered model names matching the wildcard filter, in natural order."""
    if module:
        all_models = list(_module_to_models[module])  # ok: a set of names, sorted before it is returned
    else:
        all_models = _model_entrypoints.keys()
    if filter:
        models = set()
        for f in [filter] if isinstance(filter, str) else filter:
            models = models.union(fnmatch.filter(all_models, f))
    else:
        models = set(all_models)
    for f in [exclude_filters] if isinstance(exclude_filters, str) else exclude_filters:
        models = models.difference(fnmatch.filter(models, f))
    if pretrained:
        models = _model_has_pretrained.intersection(models)
    return sorted(models, key=_natural_key)  # ok: sorted


def model_entrypoints(module=""):
    """(name, constructor) of the registered models, in registration order (for --list-models)."""
    for name, fn in _model_entrypoints.items():  # ok: a dict iterates in insertion order, fixed by the code
        if not module or _model_to_module[name] == module:
            yield name, fn


def is_model(model_name):
    return model_name in _model_entrypoints


def model_entrypoint(model_name):
    return _model_entrypoints[model_name]


def is_model_pretrained(model_name):
    return model_name in _model_has_pretrained  # ok: membership only
