"""Checkpoints: any number of ranks writes one, any number restores it."""
