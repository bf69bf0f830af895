"""Horovod's environment and collectives: what the embedding layer and the training step share."""
