"""tf_dlrm.embedding: distributed embeddings for any Keras model.

- :class:`TableConfig` / :class:`FeatureConfig`: tables (rows, width, initializer, optimizer) apart
  from the features that read them (hotness, combiner), so features can share a table;
- :func:`plan_tables`: where every table (or column slice) lives on N ranks (pure Python);
- :class:`ShardedEmbedding`: a Keras layer, ``{feature: ids} -> {feature: pooled [b, width]}``;
- :class:`ShardedModel`: a ``keras.Model`` base whose ``train_step`` applies the shards' sparse
  gradients and allreduces the rest, so ``compile()`` / ``fit()`` work on N Horovod ranks;
  :class:`BroadcastInitialState` starts every rank from rank 0's dense weights.
"""

from tf_dlrm.embedding.config import Combiner, FeatureConfig, TableConfig
from tf_dlrm.embedding.layer import ShardedEmbedding
from tf_dlrm.embedding.model import BroadcastInitialState, ShardedModel, sharded_variables
from tf_dlrm.embedding.planning import plan_tables

__all__ = [
    "BroadcastInitialState", "Combiner", "FeatureConfig", "ShardedEmbedding", "ShardedModel", "TableConfig",
    "plan_tables", "sharded_variables",
]
