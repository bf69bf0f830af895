"""Dynamic embedding tables: raw 64-bit keys, a row inserted on a key's first sight in training,
row-wise sharding by ``hash(key) mod shards`` (issue #16).

- :mod:`tf_dlrm.sharding.dynamic_routing`: the plan (pure Python): table configs, capacity per shard,
  the 64-bit key mix and the owner of every key; no TensorFlow.
- :mod:`tf_dlrm.embedding.dynamic.hashing`: the same mix in TensorFlow, and each new row's initial values
  from ``(seed, table, key)``.
- :mod:`tf_dlrm.embedding.dynamic.shard_state`: one shard of one table: key -> row map, row metadata,
  admission and eviction.
- :mod:`tf_dlrm.embedding.dynamic.layer`: :class:`DynamicEmbedding`, the Keras layer (exchange + lookup).
- :mod:`tf_dlrm.checkpoint.dynamic_tables`: (key, row, optimizer state) per table, restored on any N.
- :mod:`tf_dlrm.embedding.serving`: the SavedModel (its key maps saved with it) serving raw keys.
- :mod:`tf_dlrm.spec.dynamic` (pure Python): ``dynamic: true`` features of a FeatureSpec;
  :mod:`tf_dlrm.cli.dynamic_builder`: the DLRM ``main.py`` builds for them.
"""
