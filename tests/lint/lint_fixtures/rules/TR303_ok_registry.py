"""Near misses for TR303: registries of models and classes (dicts keep insertion order; a set filled by a
registering decorator holds the registered objects), sorted sets and sets of ints."""

import fnmatch

_model_entrypoints = {}  # model name -> entry point, filled by @register_model
_model_tags = set()
_leaf_modules = set()  # classes registered by @register_leaf
_autowrap_functions = set()


def register_model(fn):
    _model_entrypoints[fn.__name__] = fn
    _model_tags.add(fn.__name__)
    return fn


def register_leaf(module):
    _leaf_modules.add(module)
    return module


def register_function(name_or_fn):
    _autowrap_functions.add(name_or_fn)
    return name_or_fn


def list_models(pattern="*"):
    names = [name for name in _model_entrypoints if fnmatch.fnmatch(name, pattern)]  # ok: a dict
    tagged = sorted(set(_model_entrypoints) | _model_tags)  # ok: sorted
    for name in sorted(_model_tags):  # ok: sorted
        names.append(name)
    return names, tagged


def get_leaf_modules():
    return list(_leaf_modules)  # ok: a registry of classes


def get_autowrap_functions():
    return list(_autowrap_functions)  # ok: a registry of functions


def shards(n):
    ids = list({i * 3 % 7 for i in range(n)})  # ok: ints keep their order
    sizes = list(set([64, 128, 256]))  # ok: ints
    return ids, sizes
