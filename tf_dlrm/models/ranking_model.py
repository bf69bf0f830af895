"""RankingModel: the base of every model on the sharded embedding (DLRM, DCNv2, DeepFM, Wide & Deep, yours).

A model is one class in one file. It says, in one place:

- ``model_name``: the name ``--model`` picks it by (:mod:`tf_dlrm.models.registry`);
- ``Config``: a frozen dataclass of its own hyper-parameters, each field made with :func:`option`
  (a default, the help of its command-line flag, the flag's name when it differs from the field's);
  ``main.py`` defines a flag per field and checkpoints store the config;
- :meth:`tables` and :meth:`features`: the tables and features it reads, from the spec's one deep
  table and feature per categorical column (DeepFM and Wide & Deep add width-1 tables);
- :meth:`create_layers`, :meth:`build_dense`, :meth:`dense_call`: its layers after the embedding.

A model is a :class:`tf_dlrm.embedding.Model`, called as every library model is: with a dict of named
features (one entry per categorical feature, the numerical features as one ``[b, n]`` tensor under
``"numerical"``) it returns logits ``[b, 1]``; ``fit`` trains it. ``main.py``'s trainer calls it the same way,
and on the XLA path :meth:`embed` then :meth:`dense_call` (the part XLA compiles); it finds weights by
the kind marked on each (:mod:`tf_dlrm.embedding.variable_kind`), so a model needs no trainer code of
its own. A minimal model::

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
import inspect
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import keras
import tensorflow as tf

from tf_dlrm.embedding.model import Model
from tf_dlrm.embedding.table_config import FeatureConfig, FrequencyRegularizer, TableConfig
from tf_dlrm.models.layers.crossed_ids import crossed_ids
from tf_dlrm.spec.format import NUMERICAL_CHANNEL


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


def check_dropout(rate, flag: str) -> float:
    """``rate`` as a float in [0, 1); a ValueError names ``--flag``."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate < 1.0:
        raise ValueError(f"Expected --{flag} in [0, 1) (the fraction of hidden units zeroed in training). "
                         f"Received: --{flag}={rate!r}")
    return float(rate)


def check_cross(num_layers, low_rank) -> None:
    """``--num_cross_layers`` >= 1 and ``--cross_low_rank`` >= 0 (0: full rank), integers; a ValueError names the flag."""
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"Expected --num_cross_layers >= 1. Received: --num_cross_layers={num_layers!r}")
    if isinstance(low_rank, bool) or not isinstance(low_rank, int) or low_rank < 0:
        raise ValueError(f"Expected --cross_low_rank >= 0 (0: full rank). Received: --cross_low_rank={low_rank!r}")


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """The ``Config`` of a model without hyper-parameters of its own."""


def dense_forward(model, numerical, embeddings, training: bool):
    """``model.dense_call(numerical, embeddings)``, in training or not: ``training`` is passed where its
    ``dense_call`` takes it. The trainer's ``--xla`` path calls it outside any Keras layer call, where no
    call context would tell the model's dropout that it trains."""
    if "training" in inspect.signature(model.dense_call).parameters:
        return model.dense_call(numerical, embeddings, training=training)
    return model.dense_call(numerical, embeddings)


def column_sources(count: int) -> tuple[tuple, ...]:
    """Sources of the plain features: feature ``i`` reads categorical column ``i``."""
    return tuple(("column", index) for index in range(count))


class RankingModel(Model):
    """``{"numerical": [b, n], feature name: ids, ...} -> logits [b, 1]`` (float32) over one sharded embedding.

    Args:
        embedding: an unbuilt or built :class:`tf_dlrm.embedding.DistributedEmbedding` (or the single-process
            reference :class:`tf_dlrm.embedding.embedding_bank.EmbeddingBank`); its first
            ``num_categorical`` features read the spec's categorical columns and are named like them,
            any after them come from :meth:`features` (derived from the columns by ``sources``).
        num_numerical: numerical features per sample.
        num_categorical: categorical columns of the spec (None: every feature of ``embedding``).
        seed: base seed of the dense initialisers.
        config: an instance of ``Config``; or give its fields as keywords instead.
        sources: per feature of ``embedding``, where its ids come from (:meth:`features`): ``("column",
            i)`` the ids of column ``i``, ``("cross", i, j)`` columns ``i`` and ``j`` hashed together
            (:mod:`tf_dlrm.models.layers.crossed_ids`); default every feature reads its own column. A
            model deriving features needs an embedding with ``data_parallel_input`` (every rank derives
            the ids of its local batch).
        **kwargs: ``Config`` fields, then Keras' (``name``, ``dtype``) and :class:`tf_dlrm.embedding.Model`'s.
    """

    model_name: ClassVar[str] = ""
    Config: ClassVar[type] = NoOptions
    # Base rate of the embedding optimizer, per optimizer name, when no rate flag is given (see
    # tf_dlrm.cli.flags.family_rate); a model whose embeddings learn slower than DLRM's sets it.
    embedding_learning_rates: ClassVar[Mapping[str, float]] = {}
    # The rare-id regularizer of every table when neither --embedding_frequency_l2 nor --embedding_min_count is
    # given (tf_dlrm.cli.flags.rare_id_settings); None: those flags' defaults (off). A model whose tables
    # memorize ids seen once or twice sets it.
    default_frequency_regularizer: ClassVar[FrequencyRegularizer | None] = None

    def __init__(self, embedding, num_numerical: int, num_categorical: int | None = None, seed: int = 0, config=None,
                 sources=None, **kwargs):
        given = {name: kwargs.pop(name) for name in [f.name for f in dataclasses.fields(self.Config)] if name in kwargs}
        if config is None:
            config = self.make_config(given)
        elif given:
            raise TypeError(f"{type(self).__name__}: give config= or its fields, not both. Received fields: {sorted(given)}")
        elif not isinstance(config, self.Config):
            raise TypeError(f"Expected config to be a {self.Config.__qualname__}. Received: {type(config).__qualname__}")
        kwargs.setdefault("name", self.model_name or type(self).__name__.lower())
        super().__init__(**kwargs)
        if not hasattr(embedding, "input_modes"):
            raise TypeError(f"Expected a tf_dlrm.embedding.DistributedEmbedding (its dynamic tables placed with "
                            f"Placement(dynamic=...)) or an EmbeddingBank. Received: {type(embedding).__qualname__}")
        self.model_config = config
        self.embedding = embedding
        self.num_numerical = int(num_numerical)
        self.seed = int(seed)
        widths = list(embedding.output_widths)
        self.num_categorical = len(widths) if num_categorical is None else int(num_categorical)
        if not 0 < self.num_categorical <= len(widths):
            raise ValueError(f"Expected 1 to {len(widths)} categorical columns (the embedding's features). "
                             f"Received: num_categorical={num_categorical}")
        self.deep_width = sum(widths[:self.num_categorical])
        self.extra_width = sum(widths[self.num_categorical:])
        self.sources = column_sources(len(widths)) if sources is None else tuple(tuple(s) for s in sources)
        self._check_sources()
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
    def tables(cls, config, deep: Sequence[TableConfig], crossed: Sequence = ()) -> list[TableConfig]:
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
        ``embeddings`` as the embedding returns them -> logits ``[b, 1]`` float32. A model whose layers
        behave differently in training (dropout) takes a keyword ``training=None`` and passes it on."""
        raise NotImplementedError(f"{type(self).__name__} must define dense_call(numerical, embeddings)")

    @classmethod
    def table_optimizers(cls, config, tables: Sequence[TableConfig], num_deep: int) -> dict[int, object]:
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
        return dense_forward(self, inputs[NUMERICAL_CHANNEL], self.embed(inputs, training=training), training)

    def embed(self, inputs, training=None):
        """The embedding's stacked output (``[b, F, D]``, or ``[b, sum of widths]``) for the features of
        ``inputs``: what :meth:`dense_call` takes."""
        numerical = inputs[NUMERICAL_CHANNEL]
        return self.embedding(self.embedding_inputs(inputs), self.embedding_weights(inputs) or None,
                              local_batch=tf.shape(numerical)[0], training=training, stacked=True)

    @property
    def input_modes(self) -> dict[str, str]:
        """``{input name: "global" or "local"}``: what a reader gives this rank (the numerical features
        always for its local batch); features derived from the columns need every column local."""
        if self.sources == column_sources(len(self.sources)):
            return {**self.embedding.input_modes, NUMERICAL_CHANNEL: "local"}
        return {**{name: "local" for name in self.column_names}, NUMERICAL_CHANNEL: "local"}

    @property
    def column_names(self) -> tuple[str, ...]:
        """The spec's categorical columns, in order: the names of the first ``num_categorical`` features."""
        return tuple(f.name for f in self.embedding.output_features[:self.num_categorical])

    def embedding_inputs(self, inputs) -> dict:
        """``{feature name: ids}`` of every embedding feature from the columns in ``inputs`` (a derived
        feature's ids made here, on this rank's local batch)."""
        if self.sources == column_sources(len(self.sources)):
            return inputs
        columns, features = self.column_names, self.embedding.output_features
        ids = {}
        for index, (feature, source) in enumerate(zip(features, self.sources)):
            if source[0] == "column":
                ids[feature.name] = inputs[columns[source[1]]]
                continue
            first, second = inputs[columns[source[1]]], inputs[columns[source[2]]]
            rows = self.embedding.cardinalities
            # Column j is read by deep feature j, so its cardinality is that feature's table's rows.
            crossed = crossed_ids(first, second, rows[self.embedding.feature_tables[source[2]]],
                                  rows[self.embedding.feature_tables[index]])
            # In the dtype the reader gives ids (int32 for tables below 2^31 rows): the id exchange
            # stacks the features' ids together.
            ids[feature.name] = tf.cast(crossed, tf.convert_to_tensor(first).dtype)
        return ids

    def embedding_weights(self, inputs) -> dict:
        """``{feature name: weights}`` of the weighted features, from ``<column>_weights`` in ``inputs`` (the
        reader's name for a weighted column's weights; a feature reading a column reads its weights too)."""
        columns = self.column_names
        return {feature.name: inputs[f"{columns[source[1]]}_weights"]
                for feature, source in zip(self.embedding.features, self.sources)
                if feature.weighted and source[0] == "column" and f"{columns[source[1]]}_weights" in inputs}

    def _check_sources(self) -> None:
        features = self.embedding.output_features
        if len(self.sources) != len(features):
            raise ValueError(f"Expected one source per feature ({len(features)}). Received: {len(self.sources)} sources")
        for feature, source in zip(features, self.sources):
            kind, columns = (source[0], source[1:]) if source else (None, ())
            if kind not in ("column", "cross") or len(columns) != (2 if kind == "cross" else 1) or \
                    any(not isinstance(c, int) or not 0 <= c < self.num_categorical for c in columns):
                raise ValueError(f"Expected source ('column', i) or ('cross', i, j) with columns below "
                                 f"{self.num_categorical} for feature {feature.name!r}. Received: {source}")
        if self.sources != column_sources(len(features)) and not self.embedding.data_parallel_input:
            raise ValueError("Expected an embedding with data_parallel_input=True for a model deriving features from "
                             "the columns (every rank derives the ids of its local batch)")

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
                "sources": [list(s) for s in self.sources], **self.config_record()}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["embedding"] = keras.saving.deserialize_keras_object(config["embedding"])
        return cls(**config)
