"""Models by name, and by import path: what ``--model`` picks.

Every module of :mod:`tf_dlrm.models` is imported the first time the registry is read, so a model
file that decorates its class with :func:`register` is found without editing any other file.
``--model=package.module:Name`` imports a user's model instead: a :class:`RankingModel` subclass
(registered or not; ``main.py`` makes its tables from the spec and defines its ``Config``'s flags), or
any :class:`tf_dlrm.embedding.Model` subclass, or a function returning one (:func:`is_library_model`:
it declares its own tables and features, named like the spec's categorical features, and ``main.py``
calls it with ``feature_spec=`` when it takes that keyword, else with no argument). Checkpoints
record the same string (:func:`reference_of`).
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import traceback

from tf_dlrm.embedding.model import Model
from tf_dlrm.models.ranking_model import NoOptions, RankingModel

_MODELS: dict[str, type] = {}


class ModelError(ValueError):
    """A user's model (``--model=package.module:Class``) failed; the message names it and the place."""

_scanned = False


def register(cls):
    """Class decorator: makes ``cls`` (a :class:`RankingModel` with a ``model_name``) pickable by name."""
    if not (isinstance(cls, type) and issubclass(cls, RankingModel)):
        raise TypeError(f"Expected a subclass of tf_dlrm.models.ranking_model.RankingModel. Received: {cls!r}")
    name = cls.model_name
    if not name or ":" in name:
        raise ValueError(f"Expected {cls.__qualname__}.model_name to be a non-empty name without ':'. Received: {name!r}")
    known = _MODELS.get(name)
    if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"Model name {name!r} is taken by {known.__module__}:{known.__qualname__}. "
                         f"Received: {cls.__module__}:{cls.__qualname__}")
    _MODELS[name] = cls
    return cls


def _scan() -> None:
    """Imports every module of tf_dlrm.models once (their :func:`register` calls fill the registry)."""
    global _scanned
    if _scanned:
        return
    import tf_dlrm.models as package

    for module in sorted(m.name for m in pkgutil.iter_modules(package.__path__)):
        importlib.import_module(f"{package.__name__}.{module}")
    _scanned = True


def registered() -> dict[str, type]:
    """``{name: class}`` of every registered model, sorted by name."""
    _scan()
    return dict(sorted(_MODELS.items()))


def lookup(reference: str) -> type:
    """The model class of ``--model=reference``: a registered name, or ``package.module:Class``."""
    reference = str(reference).strip()
    if ":" not in reference:
        models = registered()
        if reference not in models:
            raise ValueError(f"Expected --model to be one of {list(models)} or an import path package.module:Class. "
                             f"Received: --model={reference!r}")
        return models[reference]
    module_name, _, attribute = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"--model={reference}: cannot import module {module_name!r} ({error}); is it on PYTHONPATH?") from error
    except Exception as error:  # noqa: BLE001: a user's module failing as it is imported, whatever the reason
        raise ValueError(f"--model={reference}: importing module {module_name!r} failed: {where_raised(error)}") from error
    cls = module
    for part in attribute.split("."):
        cls = getattr(cls, part, None)
    if not (isinstance(cls, type) and issubclass(cls, Model)) and not inspect.isfunction(cls):
        raise ValueError(f"Expected --model={reference} to name a subclass of tf_dlrm.embedding.Model (or of "
                         f"tf_dlrm.models.ranking_model.RankingModel), or a function returning one. Received: {cls!r}")
    return cls


def is_library_model(cls) -> bool:
    """Whether ``cls`` (what :func:`lookup` found) is a library model, not a :class:`RankingModel`: a
    :class:`tf_dlrm.embedding.Model` subclass or a function making one, holding its own tables."""
    return not (isinstance(cls, type) and issubclass(cls, RankingModel))


def config_class(cls) -> type:
    """The dataclass of the model's own hyper-parameters (a library model has none ``main.py`` knows)."""
    return NoOptions if is_library_model(cls) else cls.Config


def where_raised(error: BaseException) -> str:
    """``"RuntimeError: text (file.py:8, in build_dense)"``: an error of a user's model in one line, with
    the place that raised it (the innermost frame)."""
    frames = traceback.extract_tb(error.__traceback__)
    place = f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""
    return f"{type(error).__name__}: {error}{place}"


def is_plugin(reference: str) -> bool:
    """Whether ``--model=reference`` is a user's import path rather than a model of tf_dlrm."""
    return ":" in str(reference)


def reference_of(cls) -> str:
    """``cls``'s registered name when the registry holds it under that name, else ``module:Class``."""
    _scan()
    if getattr(cls, "model_name", "") and _MODELS.get(cls.model_name) is cls:
        return cls.model_name
    return f"{cls.__module__}:{cls.__qualname__}"
