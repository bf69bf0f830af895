"""A user's model, outside tf_dlrm: picked with ``main.py --model=tests.models.two_tower:TwoTower``.

Two towers: one over the numerical features, one over the concatenated embeddings; the logit is
their dot product plus a bias. Not registered: main.py finds it by import path, defines its
``--tower_dims`` flag, checkpoints its config under that path and exports it, with no change to tf_dlrm.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tf_dlrm.models.ranking_model import RankingModel, check_widths, option


@dataclasses.dataclass(frozen=True)
class TwoTowerConfig:
    tower_dims: tuple[int, ...] = option((16, 8), "Widths of each tower; the logit is the dot product of their outputs.")

    def __post_init__(self):
        object.__setattr__(self, "tower_dims", check_widths(self.tower_dims, "tower_dims"))


def tower(widths, seed: int, name: str) -> keras.Sequential:
    # Seeded: every run (and every rank before the broadcast) starts from the same weights.
    layers = [keras.layers.Dense(width, activation="relu" if index < len(widths) - 1 else None,
                                 kernel_initializer=keras.initializers.GlorotUniform(seed=seed + index), name=f"dense_{index}")
              for index, width in enumerate(widths)]
    return keras.Sequential(layers, name=name)


@keras.saving.register_keras_serializable(package="tests")
class TwoTower(RankingModel):
    model_name = "two_tower"
    Config = TwoTowerConfig

    def create_layers(self):
        if not self.num_numerical:
            raise ValueError("TwoTower's first tower reads the numerical features. Received: none")
        dims = self.model_config.tower_dims
        self.numerical_tower = tower(dims, self.seed * 10 + 1, "numerical_tower")
        self.embedding_tower = tower(dims, self.seed * 10 + 5, "embedding_tower")

    def build_dense(self, input_shape):
        self.numerical_tower.build((None, self.num_numerical))
        self.embedding_tower.build((None, self.deep_width + self.extra_width))
        self.bias = self.add_weight(name="bias", shape=(1,), initializer="zeros")

    def dense_call(self, numerical, embeddings):
        first = self.numerical_tower(tf.cast(numerical, self.compute_dtype))
        second = self.embedding_tower(self.flat_embeddings(embeddings))
        logits = tf.reduce_sum(first * second, axis=1, keepdims=True) + tf.cast(self.bias, self.compute_dtype)
        return tf.cast(logits, tf.float32)

    def describe(self, xla: bool = False) -> dict[str, dict]:
        dims = list(self.model_config.tower_dims)
        return {"towers": {"tower_dims": dims, "line": f"two towers of widths {dims}"}}
