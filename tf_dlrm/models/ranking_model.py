"""RankingModel: the base of every model on the sharded embedding (DLRM, DCNv2, DeepFM, Wide & Deep, yours).

A model is one class in one file. It says, in one place:

- ``model_name``: the name ``--model`` picks it by (:mod:`tf_dlrm.models.registry`);
- ``Config``: a frozen dataclass of its own hyper-parameters, each field made with :func:`option`
  (a default, the help of its command-line flag, the flag's name when it differs from the field's);
  ``main.py`` defines a flag per field and checkpoints store the config;
- :meth:`tables` and :meth:`features`: the tables and features it reads, from the spec's one deep
  table and feature per categorical column (DeepFM and Wide & Deep add width-1 tables);
- :meth:`create_layers`, :meth:`build_dense`, :meth:`dense_call`: its layers after the embedding.

The trainer calls ``model((numerical, categorical))``, and on the XLA path
``model.embedding(categorical, local_batch=..., training=True)`` then ``model.dense_call(numerical,
embeddings)``; it finds weights by the kind marked on each (:mod:`tf_dlrm.embedding.variable_kind`), so a
model needs no trainer code of its own. A minimal model::

    @register
    class Linear(RankingModel):
        model_name = "linear"

        @dataclasses.dataclass(frozen=True)
        class Config:
            units: int = option(8, "Hidden units.")

        def create_layers(self):
            self.mlp = MLP((self.model_config.units, 1), final_activation=None, seed=self.seed, name="mlp")

        def build_dense(self, input_shape):
            self.mlp.build(input_shape)

        def dense_call(self, numerical, embeddings):
            return tf.cast(self.mlp(self.deep_input(numerical, self.flat_embeddings(embeddings))), tf.float32)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import keras
import tensorflow as tf

from tf_dlrm.embedding.table_config import FeatureConfig
from tf_dlrm.sharding.plan import TableSpec


def option(default, help: str, flag: str | None = None, choices: Sequence[str] | None = None):
    """A field of a model's ``Config``: its default, its flag's help, the flag's name (default: the
    field's) and, for a string, the values the flag accepts. Tuples of ints are comma-separated flags."""
    metadata = {"help": help, "flag": flag, "choices": tuple(choices) if choices else None}
    return dataclasses.field(default=default, metadata=metadata)


def check_widths(widths, flag: str) -> tuple[int, ...]:
    """``widths`` as a tuple of positive ints; a ValueError names ``--flag``."""
    widths = tuple(widths)
    if not widths or any(isinstance(w, bool) or not isinstance(w, int) or w <= 0 for w in widths):
        raise ValueError(f"Expected --{flag} to be positive widths. Received: --{flag}={list(widths)}")
    return widths


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """The ``Config`` of a model without hyper-parameters of its own."""


def column_sources(count: int) -> tuple[tuple, ...]:
    """Sources of the plain features: feature ``i`` reads categorical column ``i``."""
    return tuple(("column", index) for index in range(count))


class RankingModel(keras.Model):
    """``(numerical [b, n], categorical tuple) -> logits [b, 1]`` (float32) over one sharded embedding.

    Args:
        embedding: an unbuilt or built embedding layer (:class:`DistributedEmbedding` or a subclass,
            a :class:`DynamicEmbedding`, an :class:`EmbeddingBank`); its first ``num_categorical``
            features read the spec's categorical columns, any after them come from :meth:`features`.
        num_numerical: numerical features per sample.
        num_categorical: categorical columns of the spec (None: every feature of ``embedding``).
        seed: base seed of the dense initialisers.
        config: an instance of ``Config``; or give its fields as keywords instead.
        **kwargs: ``Config`` fields, then Keras' (``name``, ``dtype``).
    """

    model_name: ClassVar[str] = ""
    Config: ClassVar[type] = NoOptions
    # Base rate of the embedding optimizer, per optimizer name, when no rate flag is given (see
    # tf_dlrm.cli.flags.family_rate); a model whose embeddings learn slower than DLRM's sets it.
    embedding_learning_rates: ClassVar[Mapping[str, float]] = {}

    def __init__(self, embedding, num_numerical: int, num_categorical: int | None = None, seed: int = 0, config=None,
                 **kwargs):
        given = {name: kwargs.pop(name) for name in [f.name for f in dataclasses.fields(self.Config)] if name in kwargs}
        if config is None:
            config = self.make_config(given)
        elif given:
            raise TypeError(f"{type(self).__name__}: give config= or its fields, not both. Received fields: {sorted(given)}")
        elif not isinstance(config, self.Config):
            raise TypeError(f"Expected config to be a {self.Config.__qualname__}. Received: {type(config).__qualname__}")
        kwargs.setdefault("name", self.model_name or type(self).__name__.lower())
        super().__init__(**kwargs)
        self.model_config = config
        self.embedding = embedding
        self.num_numerical = int(num_numerical)
        self.seed = int(seed)
        widths = list(embedding.feature_widths)
        self.num_categorical = len(widths) if num_categorical is None else int(num_categorical)
        if not 0 < self.num_categorical <= len(widths):
            raise ValueError(f"Expected 1 to {len(widths)} categorical columns (the embedding's features). "
                             f"Received: num_categorical={num_categorical}")
        self.deep_width = sum(widths[:self.num_categorical])
        self.extra_width = sum(widths[self.num_categorical:])
        self.create_layers()

    # ------------------------------------------------------------------ what a model defines

    @classmethod
    def make_config(cls, values: Mapping[str, Any]):
        """``Config`` from plain values (lists for tuples, as JSON gives them back)."""
        fields = {f.name: f for f in dataclasses.fields(cls.Config)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ValueError(f"{cls.__qualname__}: unknown hyper-parameters {unknown}. Expected some of {sorted(fields)}")
        return cls.Config(**{name: tuple(value) if isinstance(value, list) else value for name, value in values.items()})

    @classmethod
    def tables(cls, config, deep: Sequence[TableSpec], crossed: Sequence = ()) -> list[TableSpec]:
        """Every table the model reads: ``deep`` (one per categorical column, in spec order) first,
        then any of its own. ``crossed``: the spec's crossed features (:mod:`tf_dlrm.spec.crossed_features`)."""
        return list(deep)

    @classmethod
    def features(cls, config, deep: Sequence[FeatureConfig], crossed: Sequence = ()
                 ) -> tuple[tuple[FeatureConfig, ...], tuple[tuple, ...]]:
        """``(features, sources)``: ``deep`` first, then any of its own; ``sources[f]`` says where feature
        ``f``'s ids come from: ``("column", i)`` (categorical column ``i``) or ``("cross", i, j)``."""
        return tuple(deep), column_sources(len(deep))

    @classmethod
    def dense_stacks(cls, config) -> list[tuple[int, ...]]:
        """The widths of the model's MLPs, for estimates of its step's cost (Horovod's cycle time):
        by default every tuple-of-widths hyper-parameter of ``config``."""
        stacks = []
        for field in dataclasses.fields(config):
            value = getattr(config, field.name)
            if isinstance(value, tuple) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                stacks.append(value)
        return stacks

    def create_layers(self) -> None:
        """Makes the layers after the embedding (``self.model_config`` and the widths are set)."""

    def build_dense(self, input_shape) -> None:
        """Builds the layers of :meth:`create_layers`; ``input_shape``: :meth:`deep_input`'s,
        ``[b, numerical + deep widths]``."""

    def dense_call(self, numerical, embeddings):  # pragma: no cover - every model defines it
        """Everything after the embedding lookup (the data-parallel part, which ``--xla`` compiles):
        ``embeddings`` as the embedding returns them -> logits ``[b, 1]`` float32."""
        raise NotImplementedError(f"{type(self).__name__} must define dense_call(numerical, embeddings)")

    @classmethod
    def table_optimizers(cls, config, tables: Sequence[TableSpec], num_deep: int) -> dict[int, object]:
        """``{table index: optimizer object}`` (:mod:`tf_dlrm.embedding.optimizers`) of the tables in
        ``tables`` (:meth:`tables`' result; the first ``num_deep`` are the deep ones) that train with
        another optimizer than the run's embedding one; none by default."""
        return {}

    def describe(self, xla: bool = False) -> dict[str, dict]:
        """What the run's log reports about the model: ``{event name: fields}``, a field ``line`` being
        the sentence printed on the console (not logged)."""
        return {}

    # ------------------------------------------------------------------ shared by the models

    def build(self, input_shape=None):
        """Builds the embedding and the dense layers from the widths the model knows: Keras' default
        build traces ``call`` symbolically, where the embedding's exchange cannot run."""
        if not self.embedding.built:
            self.embedding.build(None)
        self.build_dense((None, self.num_numerical + self.deep_width))

    def call(self, inputs, training=False):
        numerical, categorical = inputs
        embeddings = self.embedding(categorical, local_batch=tf.shape(numerical)[0])
        return self.dense_call(numerical, embeddings)

    def flat_embeddings(self, embeddings):
        """``[b, sum of widths]`` in compute dtype (the embedding gives ``[b, T, D]`` for one width)."""
        return tf.reshape(tf.cast(embeddings, self.compute_dtype), [-1, self.deep_width + self.extra_width])

    def split_embeddings(self, embeddings):
        """``(deep [b, deep widths], extra [b, widths of the model's own features])`` in compute dtype."""
        flat = self.flat_embeddings(embeddings)
        if not self.extra_width:
            # No slice at all: a slice's gradient (StridedSliceGrad) writes a zeroed copy of the whole block.
            return flat, flat[:, :0]
        # One split: its gradient is one concat, where two slices' gradients are two zeroed full copies.
        deep, extra = tf.split(flat, [self.deep_width, self.extra_width], axis=1)
        return deep, extra

    def deep_input(self, numerical, deep):
        """Numerical features next to the deep embeddings: ``[b, numerical + deep widths]``."""
        return tf.concat([tf.cast(numerical, self.compute_dtype), deep], axis=1)

    @staticmethod
    def config_record_of(config) -> dict:
        """A ``Config`` as plain JSON data (tuples as lists)."""
        return {name: list(value) if isinstance(value, tuple) else value for name, value in dataclasses.asdict(config).items()}

    @classmethod
    def flag_names(cls) -> dict[str, str]:
        """``{Config field: its flag's name}`` (the field's own name unless :func:`option` gave another)."""
        return {f.name: f.metadata.get("flag") or f.name for f in dataclasses.fields(cls.Config)}

    def config_record(self) -> dict:
        """This model's ``Config`` as plain JSON data."""
        return self.config_record_of(self.model_config)

    def get_config(self):
        return {**super().get_config(), "embedding": keras.saving.serialize_keras_object(self.embedding),
                "num_numerical": self.num_numerical, "num_categorical": self.num_categorical, "seed": self.seed,
                **self.config_record()}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["embedding"] = keras.saving.deserialize_keras_object(config["embedding"])
        return cls(**config)
