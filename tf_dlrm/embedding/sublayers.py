"""The layers nested inside a Keras model, found without relying on Keras internals alone.

Keras 3 has no public recursive walk: ``Model.layers`` lists a model's direct children, and a plain
``keras.Layer`` lists none. Every Keras 3 release so far has ``Layer._flatten_layers``, the walk Keras
itself uses for weights and metrics, so :func:`sublayers` takes it where it exists; where it does not, it
walks the layers reachable through attributes (and lists, tuples and dicts of them), which finds what
Keras' attribute tracking finds for layers assigned in ``__init__``.
"""

from __future__ import annotations

import keras


def sublayers(model) -> list:
    """Every layer nested in ``model`` at any depth, ``model`` itself excluded, each once."""
    flatten = getattr(model, "_flatten_layers", None)
    if callable(flatten):
        return list(flatten(include_self=False))
    return walk_attributes(model)


def walk_attributes(model) -> list:
    """The layers reachable from ``model``'s attributes, depth first, each once (the fallback of
    :func:`sublayers`, public to be tested against Keras' own walk)."""
    found, seen = [], {id(model)}

    def children(value):
        if isinstance(value, keras.Layer):
            yield value
        elif isinstance(value, (list, tuple)):
            for item in value:
                yield from children(item)
        elif isinstance(value, dict):
            for item in value.values():
                yield from children(item)

    def visit(layer):
        for name, value in vars(layer).items():
            if name.startswith("__"):
                continue
            for child in children(value):
                if id(child) not in seen:
                    seen.add(id(child))
                    found.append(child)
                    visit(child)

    visit(model)
    return found
