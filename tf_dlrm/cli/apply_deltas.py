"""``python -m tf_dlrm.cli.apply_deltas`` (``tf-dlrm-apply-deltas``): an exported SavedModel brought forward by deltas.

    python -m tf_dlrm.cli.apply_deltas --saved_model_path=serving/step_40 --delta_dir=deltas \
        --output_path=serving/step_100 [--up_to_step=100]

reads the export (``main.py --mode=export`` of a checkpoint at step S0), takes the published deltas
(:mod:`tf_dlrm.checkpoint.deltas`) that follow S0 in a chain (each starting where the one before ended), up to
``--up_to_step`` or as far as the chain goes, and writes a new SavedModel equal to ``--mode=export`` of a checkpoint
at the last delta's step: the same graph, its variables with the deltas' rows and dense weights written in.

Dynamic tables: the evicted keys leave the export's key -> row maps, known keys get their new rows, new keys take free
rows of the shard the training routed them to; every key then serves what the full export serves.

Only the SavedModel's variables change: ``saved_model.pb`` is copied as it is, and ``variables/variables`` is read
and written back tensor by tensor (TensorFlow's own checkpoint reader and ``SaveV2``), same keys, dtypes and shapes,
so the result loads with plain TensorFlow (``tf.saved_model.load``, TF Serving, Triton) as the export did.
Where each table and dense weight lives in it is in the export's ``tf_dlrm_serving.json`` (``variables``).
``tf_dlrm_serving.json`` then says the new ``step``, the export's (``base_step``) and the deltas applied.

Refused, in one line naming the delta, before anything is written: a gap in the chain (a delta missing or never
published: no manifest), a delta that began before the export's step, a file failing its sha256, tables that
differ from the export's, and a ``--up_to_step`` no delta reaches. The output is staged and published whole
(:func:`tf_dlrm.io.publish.staged_output`); it must be a new path (the export is never changed).
"""

from __future__ import annotations

if __name__ == "__main__":  # before the imports below: a stop signal while they run counts (tf_dlrm/io/early_stop.py)
    from tf_dlrm.io.early_stop import stop_while_starting

    stop_while_starting("tf_dlrm.cli.apply_deltas")

import json
import os
import shutil
import sys

import numpy as np

from tf_dlrm.checkpoint import deltas
from tf_dlrm.io.publish import MANIFEST as OUTPUT_MANIFEST, staged_output

SERVING_INFO = "tf_dlrm_serving.json"  # (tf_dlrm.cli.export's, not imported: that pulls in the model builders)
VARIABLES = os.path.join("variables", "variables")
WRITER = "tf_dlrm.cli.apply_deltas"


def read_export(saved_model_path: str) -> dict:
    """The export's ``tf_dlrm_serving.json``, refused when it has no step or no variable map."""
    path = os.path.join(saved_model_path, SERVING_INFO)
    if not os.path.isfile(os.path.join(saved_model_path, "saved_model.pb")) or not os.path.isfile(path):
        raise deltas.DeltaError(f"--saved_model_path={saved_model_path} is not an export of main.py --mode=export "
                                f"(no saved_model.pb or no {SERVING_INFO})")
    with open(path, encoding="utf-8") as handle:
        info = json.load(handle)
    if info.get("step") is None or not info.get("variables"):
        raise deltas.DeltaError(f"--saved_model_path={saved_model_path}: its {SERVING_INFO} has no step or no variable map "
                                "(an export written before delta publishing, or of a model whose weights it could not "
                                "place): export the checkpoint again with main.py --mode=export")
    return info


def _check_tables(path: str, manifest: dict, layout: dict) -> None:
    found = [(t["name"], t["rows"], t["dim"]) for t in manifest["tables"]]
    expected = [(t["name"], t["rows"], t["dim"]) for t in layout["tables"]]
    if found != expected:
        raise deltas.DeltaError(f"delta {path}: its tables (name, rows, dim) {found} are not the export's {expected}")
    found = [(t["name"], t["dim"]) for t in manifest.get("dynamic", [])]
    expected = [(t["name"], t["dim"]) for t in layout.get("dynamic", [])]
    if found != expected:
        raise deltas.DeltaError(f"delta {path}: its dynamic tables (name, dim) {found} are not the export's {expected}")
    names = {entry["name"] for entry in layout["dense"]}
    missing = [entry["name"] for entry in manifest["dense"] if entry["name"] not in names]
    if missing:
        raise deltas.DeltaError(f"delta {path}: dense weight {missing[0]!r} is not in the export")


def _apply_dynamic(tensors: dict, path: str, manifest: dict, table: dict, served: dict) -> None:
    """One delta's keys of one dynamic table into the export's shards: removed keys leave their map (their rows are
    freed), a changed key's row is overwritten, a new key takes the lowest free row of its shard (the key's shard is
    the training's: ``owner_shard(key)`` over the same number of shards)."""
    from tf_dlrm.sharding.dynamic_routing import owner_shard

    pieces = table["pieces"]
    removed = np.concatenate([deltas.load(path, p["removed_keys"], manifest) for p in pieces] or [np.zeros(0, np.int64)])
    keys = np.concatenate([deltas.load(path, p["keys"], manifest) for p in pieces] or [np.zeros(0, np.int64)])
    values = np.concatenate([deltas.load(path, p["values"], manifest) for p in pieces] or [np.zeros((0, table["dim"]), np.float32)])
    if values.shape != (keys.size, table["dim"]) or keys.dtype != np.int64 or removed.dtype != np.int64:
        raise deltas.DeltaError(f"delta {path}: the keys and rows of dynamic table {table['name']!r} are not int64 [n] "
                                f"and float32 [n, {table['dim']}]")
    for shard, names in served["shards"].items():
        map_keys, map_rows = tensors[names["map_keys"]], tensors[names["map_rows"]]
        occupied, row_key, storage = tensors[names["occupied"]], tensors[names["row_key"]], tensors[names["storage"]]
        gone = np.isin(map_keys, removed[owner_shard(removed, served["num_shards"]) == int(shard)])
        occupied[map_rows[gone]] = False
        map_keys, map_rows = map_keys[~gone], map_rows[~gone]
        mine = owner_shard(keys, served["num_shards"]) == int(shard)
        shard_keys, shard_values = keys[mine], values[mine]
        row_of = dict(zip(map_keys.tolist(), map_rows.tolist()))
        new = np.array([key not in row_of for key in shard_keys.tolist()], bool)
        free = np.flatnonzero(~occupied)[:int(new.sum())]
        if free.size < new.sum():
            raise deltas.DeltaError(f"delta {path}: dynamic table {table['name']!r} shard {shard}: {int(new.sum())} new keys, "
                                    f"{free.size} free rows in the export (not the training's capacity?)")
        rows = np.array([row_of.get(key, -1) for key in shard_keys.tolist()], np.int64)
        rows[new] = free
        occupied[free], row_key[free] = True, shard_keys[new]
        storage[served["offset"] + rows] = shard_values
        tensors[names["map_keys"]] = np.concatenate([map_keys, shard_keys[new]])
        tensors[names["map_rows"]] = np.concatenate([map_rows, free.astype(map_rows.dtype)])


def apply_chain(tensors: dict, layout: dict, chain: list) -> None:
    """Writes each delta's rows and dense weights, in order, into ``tensors`` (``{checkpoint key: numpy array}``)."""
    dense_keys = {entry["name"]: entry for entry in layout["dense"]}
    for path, manifest in chain:
        _check_tables(path, manifest, layout)
        for table, served in zip(manifest["tables"], layout["tables"]):
            for piece in table["pieces"]:
                rows = deltas.load(path, piece["rows"], manifest)
                values = deltas.load(path, piece["values"], manifest)
                start, end = piece["columns"]
                if rows.dtype != np.int64 or rows.ndim != 1 or values.shape != (rows.size, end - start) or (
                        rows.size and (rows.min() < 0 or rows.max() >= table["rows"])):
                    raise deltas.DeltaError(f"delta {path}: {piece['rows']} and {piece['values']} are not rows of "
                                            f"table {table['name']!r} ([rows] ids below {table['rows']}, [rows, {end - start}] values)")
                for target in served["pieces"]:  # the served table's pieces holding some of these columns
                    low, high = max(start, target["columns"][0]), min(end, target["columns"][1])
                    if low < high:
                        array = tensors[target["key"]]
                        shift = target["columns"][0]
                        array[target["offset"] + rows, low - shift:high - shift] = values[:, low - start:high - start]
        for table, served in zip(manifest.get("dynamic", []), layout.get("dynamic", [])):
            _apply_dynamic(tensors, path, manifest, table, served)
        for entry in manifest["dense"]:
            target = dense_keys[entry["name"]]
            array = deltas.load(path, entry["file"], manifest)
            if list(array.shape) != list(target["shape"]):
                raise deltas.DeltaError(f"delta {path}: dense weight {entry['name']!r} is {list(array.shape)}, the "
                                        f"export's {target['shape']}")
            tensors[target["key"]] = array.astype(tensors[target["key"]].dtype)


def apply_deltas(saved_model_path: str, delta_dir: str, output_path: str, up_to_step: int | None = None) -> dict:
    """Writes ``output_path``: the export at ``saved_model_path`` with the chain of deltas under ``delta_dir``
    applied (see the module docstring); returns its new ``tf_dlrm_serving.json``."""
    import tensorflow as tf

    info = read_export(saved_model_path)
    base = int(info["step"])
    chain = deltas.chain(delta_dir, base, up_to_step)
    if not chain:
        raise deltas.DeltaError(f"no published delta under {delta_dir} follows step {base}, the export's: nothing to apply")
    reader = tf.train.load_checkpoint(os.path.join(saved_model_path, VARIABLES))
    names = sorted(reader.get_variable_to_dtype_map())
    tensors = {name: reader.get_tensor(name) for name in names}
    writable = [(table["name"], piece["key"]) for table in info["variables"]["tables"] for piece in table["pieces"]]
    writable += [(table["name"], key) for table in info["variables"].get("dynamic", []) for names in table["shards"].values()
                 for key in names.values()]
    for table, key in writable:
        if tensors.get(key) is None:
            raise deltas.DeltaError(f"--saved_model_path={saved_model_path}: table {table!r}'s {key} is not in its variables")
        tensors[key] = np.array(tensors[key])  # writable
    apply_chain(tensors, info["variables"], chain)
    step = chain[-1][1]["step"]
    info.update(step=step, base_step=base, deltas=[os.path.abspath(path) for path, _ in chain])
    with staged_output(output_path, "--output_path", WRITER, [saved_model_path, delta_dir]) as workspace:
        for name in os.listdir(saved_model_path):
            if name in ("variables", SERVING_INFO, OUTPUT_MANIFEST, "fingerprint.pb"):
                continue  # written below (the fingerprint hashes the variables: TensorFlow's own is made again)
            source = os.path.join(saved_model_path, name)
            (shutil.copytree if os.path.isdir(source) else shutil.copy2)(source, os.path.join(workspace, name))
        os.makedirs(os.path.join(workspace, "variables"))
        tf.raw_ops.SaveV2(prefix=os.path.join(workspace, VARIABLES), tensor_names=names, shape_and_slices=[""] * len(names),
                          tensors=[tf.constant(tensors[name]) for name in names])
        _write_fingerprint(workspace)
        with open(os.path.join(workspace, SERVING_INFO), "w", encoding="utf-8") as handle:
            json.dump(info, handle, indent=1)
    return info


def _write_fingerprint(directory: str) -> None:
    """TensorFlow's ``fingerprint.pb`` of the new SavedModel (its checksum covers the variables); none where this
    TensorFlow cannot make one (loading never needs it)."""
    try:
        from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting
    except ImportError:
        return
    with open(os.path.join(directory, "fingerprint.pb"), "wb") as handle:
        handle.write(fingerprinting.CreateFingerprintDef(directory))


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--saved_model_path", required=True, help="an export of main.py --mode=export")
    parser.add_argument("--delta_dir", required=True, help="the --delta_dir of the training run")
    parser.add_argument("--output_path", required=True, help="the new SavedModel (a new directory)")
    parser.add_argument("--up_to_step", type=int, default=None, help="the last delta to apply (default: the chain's end)")
    args = parser.parse_args(argv)
    try:
        info = apply_deltas(args.saved_model_path, args.delta_dir, args.output_path, args.up_to_step)
    except (deltas.DeltaError, ValueError, OSError) as error:
        print(f"tf_dlrm.cli.apply_deltas: error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.output_path}: the export of step {info['base_step']} with {len(info['deltas'])} delta(s) applied, "
          f"now at step {info['step']}")
    return 0


def run() -> None:
    """The tool (``python -m``, and ``tf-dlrm-apply-deltas`` through :mod:`tf_dlrm.cli.console`): a stop signal ends it
    with its staged output removed and one line (:func:`tf_dlrm.io.stop_signals.stopping_cleanly`)."""
    from tf_dlrm.io.stop_signals import stopping_cleanly

    with stopping_cleanly("tf_dlrm.cli.apply_deltas"):
        code = main()
    sys.exit(code)


if __name__ == "__main__":
    run()
