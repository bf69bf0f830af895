"""Which device each rank computes on, as NVIDIA's DLRM chooses: one GPU per rank.

On a host with GPUs, rank ``local_rank`` sees only GPU ``local_rank`` (TensorFlow's visible devices),
with memory growth on, so N ranks of one host do not all allocate on every GPU. ``use_gpu=False``
(``--cpu``) hides every GPU. tf_dlrm's own kernels (:mod:`tf_dlrm.ops`) are CPU kernels: with a GPU
the layers use TensorFlow's ops instead, said in one line. GPU training is not yet verified: no
machine of this project's CI has one.

Must run before TensorFlow initialises its devices (the first op or device query of the process).
"""

from __future__ import annotations

import os

from tf_dlrm.parallel.env import DistributedEnv


def select_devices(env: DistributedEnv, use_gpu: bool = True, tf_config=None) -> str:
    """Makes this rank's device choice (see the module docstring); returns a line describing it.
    ``tf_config``: ``tf.config`` (tests pass a stand-in that lists logical devices)."""
    if tf_config is None:
        import tensorflow as tf

        tf_config = tf.config
    gpus = tf_config.list_physical_devices("GPU")
    if not gpus:
        return "devices: CPU (no GPU)"
    if not use_gpu:
        tf_config.set_visible_devices([], "GPU")
        return f"devices: CPU (--cpu; {len(gpus)} GPU(s) hidden)"
    if env.local_rank >= len(gpus):
        raise ValueError(f"Expected one GPU per rank on each host: local rank {env.local_rank} of {env.local_size} "
                         f"ranks here, {len(gpus)} GPU(s). Run at most {len(gpus)} ranks per host, or pass --cpu")
    gpu = gpus[env.local_rank]
    tf_config.set_visible_devices([gpu], "GPU")
    tf_config.experimental.set_memory_growth(gpu, True)
    # The kernel library has CPU kernels only: TensorFlow's ops keep the work on the GPU.
    os.environ["TF_DLRM_DISABLE_KERNELS"] = "1"
    return (f"devices: GPU {env.local_rank} of {len(gpus)} ({gpu.name}) for local rank {env.local_rank}, memory growth "
            "on; tf_dlrm's CPU kernels off (TensorFlow's ops on the GPU); GPU training is not yet verified")
