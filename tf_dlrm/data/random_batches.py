"""``--dataset_type=synthetic``: random batches made in memory, for benchmarking without disk.

Same interface and batch layout as :class:`tf_dlrm.data.reader.SplitBinaryReader`; the labels are
random, so the AUC of a model trained on them is about 0.5. For learnable synthetic data on disk
use ``python -m tf_dlrm.data.synthetic``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from tf_dlrm.data.reader import read_columns
from tf_dlrm.spec.feature_spec import FeatureSpec
from tf_dlrm.spec.format import NUMERICAL_CHANNEL


class RandomBatches:
    """A fixed number of random global batches; each rank gets its slices like from files.

    Args:
        spec: gives the number of numerical features and the cardinalities.
        num_samples: samples per epoch.
        global_batch_size, rank, world_size, input_modes: as for the reader.
        seed: the batches depend only on the seed and the batch number (the same on every rank).
        distinct_batches: how many different batches are generated and then cycled (generation cost
            stays out of the timed loop).
    """

    def __init__(
        self,
        spec: FeatureSpec,
        num_samples: int,
        global_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        input_modes: Mapping[str, str] | None = None,
        seed: int = 0,
        distinct_batches: int = 8,
    ):
        if global_batch_size % world_size:
            raise ValueError(f"The global batch size must divide by the number of ranks. Received: {global_batch_size}, {world_size}")
        self.num_samples = num_samples
        self.global_batch_size = global_batch_size
        self.local_batch_size = global_batch_size // world_size
        cardinalities = spec.cardinalities()
        global_categorical, local_categorical = read_columns(spec, input_modes)
        names = spec.categorical_features
        rows = slice(rank * self.local_batch_size, (rank + 1) * self.local_batch_size)
        self._batches = []
        for index in range(max(1, distinct_batches)):
            rng = np.random.default_rng([seed, index])
            ids = [rng.integers(0, c, global_batch_size).astype(np.int32) for c in cardinalities]
            numerical = rng.random((global_batch_size, len(spec.numerical_features)), dtype=np.float32)
            label = (rng.random((global_batch_size, 1)) < 0.25).astype(np.float32)
            features = {NUMERICAL_CHANNEL: numerical[rows], **{names[i]: ids[i] for i in global_categorical},
                        **{names[i]: ids[i][rows] for i in local_categorical}}
            self._batches.append((features, label[rows]))

    @property
    def num_batches(self) -> int:
        return self.num_samples // self.global_batch_size

    def dataset(self, epoch: int = 0, start_batch: int = 0) -> tf.data.Dataset:
        count = len(self._batches)
        tensors = tf.data.Dataset.from_tensors(self._batches[0])
        for batch in self._batches[1:]:
            tensors = tensors.concatenate(tf.data.Dataset.from_tensors(batch))
        return tensors.repeat().skip(start_batch % count).take(self.num_batches - start_batch).prefetch(tf.data.AUTOTUNE)
