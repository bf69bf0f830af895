"""``--model`` and the flags of every model's hyper-parameters, defined from the models' ``Config``s.

Each field of a model's ``Config`` (:func:`tf_dlrm.models.ranking_model.option`) is one flag, named
like the field unless the option names another; models sharing a field (``--deep_mlp_dims``) share
the flag, which must then have one default. A model given by import path (``--model=pkg.mod:Class``)
has its flags defined too: :func:`define_model_flags` finds it in the command line before parsing.
Giving a flag of another model than ``--model``'s is refused, naming the models it belongs to.
"""

from __future__ import annotations

import dataclasses
import re

from absl import flags

from tf_dlrm.cli.model_config import parse_dims
from tf_dlrm.cli.nvidia_flags import VALUE_ALIASES, normalized_value
from tf_dlrm.models import registry

# The models whose flags this process defined (registered ones, plus one named by import path).
_DEFINED: dict[str, type] = {}
_MODEL_ARGUMENT = re.compile(r"^--model=(.+)$")


def model_in_argv(argv) -> str | None:
    """The value of ``--model=...`` in a command line (the last one wins, as absl's), or None."""
    found = None
    for index, argument in enumerate(argv or []):
        match = _MODEL_ARGUMENT.match(argument)
        if match:
            found = match.group(1)
        elif argument == "--model" and index + 1 < len(argv):
            found = argv[index + 1]
    return found


def define_model_flags(argv=None, flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines ``--model`` and one flag per ``Config`` field of every registered model (and of the
    model an import path in ``argv`` names)."""
    models = dict(registry.registered())
    named = model_in_argv(argv)
    if named and ":" in named:
        models[named] = registry.lookup(named)
    # The registered names are not listed here: a model added in its own file changes no other (the
    # error for an unknown name lists them).
    flags.DEFINE_string("model", "dlrm", "Model on the sharded embedding: a model of tf_dlrm by name (dlrm, dcnv2, ...: "
                        "docs/models.md), or an import path package.module:Name of a tf_dlrm.embedding.Model subclass "
                        "(or a function making one) or of a tf_dlrm.models.ranking_model.RankingModel subclass.",
                        flag_values=flag_values)
    owners: dict[str, list[str]] = {}
    fields: dict[str, dataclasses.Field] = {}
    for name, cls in models.items():
        for field in dataclasses.fields(registry.config_class(cls)):
            flag = field.metadata.get("flag") or field.name
            if flag in fields and fields[flag].default != field.default:
                raise ValueError(f"Models {owners[flag]} and {name} define --{flag} with different defaults: "
                                 f"{fields[flag].default!r} and {field.default!r}")
            fields.setdefault(flag, field)
            owners.setdefault(flag, []).append(name)
    for flag, field in fields.items():
        _define(flag, field, f"--model={', '.join(owners[flag])}: {field.metadata.get('help', '')}", flag_values)
    _DEFINED.clear()
    _DEFINED.update(models)


def _define(flag: str, field: dataclasses.Field, help_text: str, flag_values) -> None:
    default, choices = field.default, field.metadata.get("choices")
    if isinstance(default, bool):
        flags.DEFINE_bool(flag, default, help_text, flag_values=flag_values)
    elif isinstance(default, int):
        flags.DEFINE_integer(flag, default, help_text, flag_values=flag_values)
    elif isinstance(default, float):
        flags.DEFINE_float(flag, default, help_text, flag_values=flag_values)
    elif isinstance(default, tuple):
        flags.DEFINE_string(flag, ",".join(str(v) for v in default), help_text, flag_values=flag_values)
    elif choices:
        # NVIDIA's spellings parse too: aliases become tf_dlrm's value, refused ones a one-line error.
        nvidia = list(VALUE_ALIASES.get(flag, {}))
        flags.DEFINE_enum(flag, default, [*choices, *nvidia], help_text, flag_values=flag_values)
    else:
        flags.DEFINE_string(flag, default, help_text, flag_values=flag_values)


def model_from_flags(values: flags.FlagValues) -> tuple[str, object]:
    """``(--model, its Config)`` from parsed flags; a flag of another model given explicitly is refused."""
    cls = registry.lookup(values.model)
    own = {f.metadata.get("flag") or f.name: f for f in dataclasses.fields(registry.config_class(cls))}
    others = {}
    for name, other in _DEFINED.items():
        for field in dataclasses.fields(registry.config_class(other)):
            flag = field.metadata.get("flag") or field.name
            if flag not in own and values[flag].present:
                others.setdefault(flag, []).append(name)
    if others:
        flag, names = sorted(others.items())[0]
        raise ValueError(f"--{flag} applies to --model={', '.join(names)} only. Received: --model={values.model}")
    params = {}
    for flag, field in own.items():
        # A model's flags are defined when define_model_flags saw it (registered, or in its argv).
        value = normalized_value(flag, values[flag].value) if flag in values else field.default
        params[field.name] = parse_dims(value, flag) if isinstance(field.default, tuple) else value
    return values.model, registry.config_class(cls)(**params)
