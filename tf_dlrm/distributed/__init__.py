"""Model-parallel embeddings: the sharding plan and the layers that execute it."""
