"""tf_dlrm.embedding: distributed embeddings for any Keras model (the library ``main.py`` is built on).

- :class:`TableConfig` / :class:`FeatureConfig`: tables (rows, width, initializer, optimizer,
  placement) apart from the features that read them (hotness, ragged, combiner); a feature holds
  its table object, so features can share a table. :mod:`tf_dlrm.embedding.optimizers` holds the
  table optimizers (``SGD``, ``Adagrad``, ``RowWiseAdagrad``, ``LazyAdam``, ``CatchUpAdam``, ``DenseAdam``,
  ``FTRL``);
  :class:`Placement` asks for a sharding, hot rows or split bfloat16 storage; :class:`FrequencyRegularizer`
  regularizes rare ids by how often their rows were seen.
- :class:`DistributedEmbedding`: a Keras layer, ``{feature: ids} -> {feature: [batch, dim]}``; under
  Horovod each rank passes its local batch, tables are sharded table-wise / column-wise or
  replicated over the ranks (:func:`plan_tables`, pure Python).
- :class:`Model`: a ``keras.Model`` whose ``fit`` runs :class:`TrainingStep` (per-table sparse
  updates, dense gradients averaged over ranks); a hand-written loop calls a ``TrainingStep``
  itself. :class:`BroadcastInitialState` starts every rank from rank 0's dense weights.
- :func:`initialize`: Horovod initialised when ``horovodrun`` started this process, else one process; returns
  this process's rank and world size (a :class:`tf_dlrm.parallel.env.DistributedEnv`).
"""

from tf_dlrm.embedding.distributed_embedding import DistributedEmbedding
from tf_dlrm.embedding import optimizers
from tf_dlrm.embedding.model import BroadcastInitialState, Model, sharded_variables
from tf_dlrm.embedding.planning import plan_tables
from tf_dlrm.embedding.table_config import (Combiner, DynamicStorage, FeatureConfig, FrequencyRegularizer, Placement,
                                            TableConfig)
from tf_dlrm.embedding.training_step import TrainingStep
from tf_dlrm.parallel.env import initialize

__all__ = [
    "BroadcastInitialState", "Combiner", "DistributedEmbedding", "DynamicStorage", "FeatureConfig", "FrequencyRegularizer", "Model",
    "Placement", "TableConfig", "TrainingStep", "initialize", "optimizers", "plan_tables", "sharded_variables",
]
