"""tf_dlrm's own CPU kernels (``dot_interaction.cc``: DLRM's dot interaction; ``embedding_bag.cc``:
pooled multi-hot lookups, their gradient over distinct rows, SGD on distinct rows;
``assemble_columns.cc``: the embedding layer's output put in feature order in one copy;
``deduplicate.cc``: a gradient's repeated rows summed, for the sparse optimizers; beside them the
headers they share, ``id_index.h``: the index of distinct rows, ``row_blocks.h``: entries added into
rows in order on all threads), compiled by
``python -m tf_dlrm.ops.build`` (``scripts/install.sh`` runs it) into ``_tf_dlrm_ops.so`` beside
the sources. Their Python wrappers live beside them: :mod:`tf_dlrm.ops.dot_interaction`,
:mod:`tf_dlrm.ops.embedding_bag`, :mod:`tf_dlrm.ops.assemble`, and
:func:`tf_dlrm.optimizers.sparse_optimizer.deduplicate`.

:func:`kernels` loads the library once per process. Without it (not built, or built for another
TensorFlow) the layers fall back to plain TensorFlow ops, which compute the same values more
slowly; ``TF_DLRM_DISABLE_KERNELS=1`` forces that fallback, and :func:`kernels_off` does for the
functions traced inside it (XLA compiles TensorFlow's own ops only, and a SavedModel must serve
without this library).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading

# The same path as tf_dlrm.ops.build.LIBRARY (tests/ops checks it); not imported from there, so that
# `python -m tf_dlrm.ops.build` does not find its module already imported by this package.
LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_tf_dlrm_ops.so")


# Per thread: a function traced in one thread with the kernels off must not switch them off for
# another thread tracing at the same time.
_switched_off = threading.local()


@contextlib.contextmanager
def kernels_off():
    """Every kernel wrapper traced inside the block uses plain TensorFlow ops (:func:`kernels`
    returns None); functions traced after it use the kernels again. Nested blocks are fine."""
    depth = getattr(_switched_off, "depth", 0)
    _switched_off.depth = depth + 1
    try:
        yield
    finally:
        _switched_off.depth = depth


def kernels_enabled() -> bool:
    """False inside :func:`kernels_off`."""
    return not getattr(_switched_off, "depth", 0)


def kernels():
    """The loaded kernel module (``tf_dlrm_dot_interaction``, ``tf_dlrm_embedding_bag`` and their
    gradients), or None: inside :func:`kernels_off`, or when it is unavailable (with one warning
    naming the library, unless ``TF_DLRM_DISABLE_KERNELS=1`` asked for the fallback)."""
    return _loaded_kernels() if kernels_enabled() else None



@functools.lru_cache(maxsize=None)
def _loaded_kernels():
    """:func:`kernels` outside :func:`kernels_off` (cached: the library loads once per process)."""
    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get("TF_DLRM_DISABLE_KERNELS") != "1":
            from absl import logging

            logging.warning("tf_dlrm: %s; the dot interaction, multi-hot pooling and the embedding output's assembly use plain "
                            "TensorFlow ops (slower).", reason)
        return None
    return _load()


kernels.cache_clear = _loaded_kernels.cache_clear  # forgets the load (tests change the environment)


@functools.lru_cache(maxsize=None)
def _built_from_these_sources() -> bool:
    from tf_dlrm.ops import build

    # Either ISA choice is fine here: the flags change the speed of the code, not which kernels exist.
    return any(build.up_to_date(build.build_key(flags)) for flags in ([], ["-mavx2", "-mfma"]))


@functools.lru_cache(maxsize=None)
def _load():
    import tensorflow as tf

    try:
        return tf.load_op_library(LIBRARY)
    except (tf.errors.NotFoundError, OSError) as error:
        return error


def unavailable_reason() -> str | None:
    """Why :func:`kernels` returns None (a sentence naming the library), or None when it loads."""
    if os.environ.get("TF_DLRM_DISABLE_KERNELS") == "1":
        return "the kernels are disabled by TF_DLRM_DISABLE_KERNELS=1"
    if not os.path.exists(LIBRARY):
        return f"the kernel library {LIBRARY} is missing (build it with: python -m tf_dlrm.ops.build)"
    if not _built_from_these_sources():
        # A library left from older sources loads but may lack kernels the layers now ask for
        # (e.g. a dtype): refuse it by name rather than fail inside a training step.
        return (f"the kernel library {LIBRARY} was built from other sources or for another TensorFlow (its stamp "
                "differs); rebuild it with: python -m tf_dlrm.ops.build")
    loaded = _load()
    if isinstance(loaded, Exception):
        return (f"the kernel library {LIBRARY} could not be loaded ({loaded}); rebuild it with: "
                "python -m tf_dlrm.ops.build --force")
    return None
