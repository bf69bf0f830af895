"""``python -m tf_dlrm.cli.serving_repository``: an exported SavedModel laid out for a serving stack.

    python -m tf_dlrm.cli.serving_repository --saved_model_path=serving/dlrm --repository=models \
        --name=dlrm [--version=1] [--layout=triton|tf_serving]

- ``triton`` (NVIDIA Triton's TensorFlow backend): ``models/dlrm/config.pbtxt`` and
  ``models/dlrm/1/model.savedmodel/`` (the SavedModel);
- ``tf_serving`` (TensorFlow Serving's model base path): ``models/dlrm/1/`` holding the SavedModel.

Triton's ``config.pbtxt`` is written from the SavedModel's own ``serving_default`` signature (read
with ``tf.saved_model.load``), so it fits whatever ``--mode=export`` or
:func:`tf_dlrm.embedding.serving.export_saved_model` wrote: ``numerical`` and one input per feature
(one-hot, multi-hot, a ragged feature's ``*_values`` and ``*_row_lengths``, a dynamic table's raw keys),
``probability`` out. ``max_batch_size: 0``: the signature takes whole batches (a ragged feature's
``*_values`` input is not batch-shaped), so each input's ``dims`` is its full shape, ``-1`` for a
size known only when served. The repository entry is staged and published whole
(:func:`tf_dlrm.io.publish.staged_output`): an existing entry of another tool is never replaced.
"""

from __future__ import annotations

import os
import shutil
import sys

LAYOUTS = ("triton", "tf_serving")
TRITON_TYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "float64": "TYPE_FP64", "int32": "TYPE_INT32",
                "int64": "TYPE_INT64", "int8": "TYPE_INT8", "bool": "TYPE_BOOL", "string": "TYPE_STRING"}
WRITER = "tf_dlrm.cli.serving_repository"


def signature_tensors(saved_model_path: str) -> tuple[list, list]:
    """``(inputs, outputs)`` of the SavedModel's ``serving_default`` signature: ``(name, dtype, shape)``
    each, sorted by name, ``-1`` for an unknown size."""
    import tensorflow as tf

    signature = tf.saved_model.load(saved_model_path).signatures["serving_default"]

    def described(specs: dict) -> list:
        return [(name, spec.dtype.name, [-1 if size is None else int(size) for size in spec.shape.as_list()])
                for name, spec in sorted(specs.items())]

    return described(signature.structured_input_signature[1]), described(signature.structured_outputs)


def triton_config(name: str, inputs: list, outputs: list) -> str:
    """Triton's ``config.pbtxt`` for the TensorFlow SavedModel backend (protobuf text format)."""
    def tensors(kind: str, entries: list) -> list[str]:
        lines = [f"{kind} ["]
        for index, (tensor, dtype, shape) in enumerate(entries):
            if dtype not in TRITON_TYPES:
                raise ValueError(f"Expected a tensor type Triton serves ({sorted(TRITON_TYPES)}). Received: {tensor!r} "
                                 f"of {dtype}")
            lines += ["  {", f'    name: "{tensor}"', f"    data_type: {TRITON_TYPES[dtype]}",
                      f"    dims: [ {', '.join(map(str, shape))} ]", "  }" + ("," if index < len(entries) - 1 else "")]
        return lines + ["]"]

    lines = [f'name: "{name}"', 'platform: "tensorflow_savedmodel"', "max_batch_size: 0"]
    return "\n".join(lines + tensors("input", inputs) + tensors("output", outputs)) + "\n"


def write_repository(saved_model_path: str, repository: str, name: str, version: int = 1, layout: str = "triton") -> str:
    """Lays ``saved_model_path`` out under ``repository/name`` (see the module docstring); returns that path."""
    from tf_dlrm.io.publish import staged_output

    if layout not in LAYOUTS:
        raise ValueError(f"Expected --layout in {list(LAYOUTS)}. Received: --layout={layout!r}")
    if not os.path.isfile(os.path.join(saved_model_path, "saved_model.pb")):
        raise ValueError(f"--saved_model_path={saved_model_path} holds no saved_model.pb (write one with main.py --mode=export)")
    if not name or os.sep in name or name in (".", ".."):
        raise ValueError(f"Expected --name to be one directory name. Received: --name={name!r}")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"Expected --version >= 1 (serving stacks load numbered versions). Received: --version={version!r}")
    entry = os.path.join(repository, name)
    inputs, outputs = signature_tensors(saved_model_path) if layout == "triton" else ([], [])
    with staged_output(entry, "--repository/--name", WRITER, [saved_model_path]) as workspace:
        target = os.path.join(workspace, str(version), "model.savedmodel" if layout == "triton" else "")
        shutil.copytree(saved_model_path, target, dirs_exist_ok=True)
        if layout == "triton":
            with open(os.path.join(workspace, "config.pbtxt"), "w", encoding="utf-8") as handle:
                handle.write(triton_config(name, inputs, outputs))
    return entry


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--saved_model_path", required=True, help="a SavedModel written by main.py --mode=export")
    parser.add_argument("--repository", required=True, help="the model repository (Triton) or base directory (TF Serving)")
    parser.add_argument("--name", required=True, help="the model's name in the repository")
    parser.add_argument("--version", type=int, default=1)
    parser.add_argument("--layout", default="triton", choices=LAYOUTS)
    args = parser.parse_args(argv)
    try:
        entry = write_repository(args.saved_model_path, args.repository, args.name, args.version, args.layout)
    except (ValueError, OSError) as error:
        print(f"tf_dlrm.cli.serving_repository: error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.layout} model {args.name!r} version {args.version} under {entry}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
