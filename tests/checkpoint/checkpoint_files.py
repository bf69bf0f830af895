"""A published checkpoint of plain arrays, written with the store's own functions (no model)."""

from __future__ import annotations

import numpy as np

from tf_dlrm.checkpoint import store


def write_checkpoint(save_path: str, step: int, num_tables: int = 6) -> str:
    """A published checkpoint directory of ``num_tables`` arrays (manifest lists them all)."""
    temporary, final = store.prepare(save_path, step)
    files = {}
    for table in range(num_tables):
        name = f"tables/table_{table:03d}.npy"
        files[name] = store.write_npy(temporary, name, np.full((4096, 16), table + step, np.float32))
    for name in (store.MODEL_CONFIG, store.SPEC_COPY):
        files[name] = store.write_text(temporary, name, "{}\n")
    manifest = {"format": store.FORMAT, "version": store.VERSION, "step": step, "position": {}, "model": {},
                "optimizer": {}, "files": files, "tables": [], "dense": [], "optimizer_state": []}
    store.write_manifest(temporary, manifest)
    store.publish(save_path, temporary, final, keep=10)
    return final
