"""Embedding (sparse) and dense optimizers: one file each; :mod:`tf_dlrm.optimizers.config` makes them."""
