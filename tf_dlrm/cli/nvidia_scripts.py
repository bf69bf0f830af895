"""NVIDIA's entry scripts: ``dlrm.py`` and ``dcnv2.py`` of DeepLearningExamples' TF2 ``DLRM_and_DCNv2``.

NVIDIA's README runs ``python -u dlrm.py ...`` and ``python -u dcnv2.py ...``: each is NVIDIA's ``main.py``
with defaults of its own (SGD at rate 24 for DLRM, Adam at 1e-4 and the cross interaction with 3 cross layers
of rank 512 for DCNv2). The scripts of these names beside ``main.py`` put those defaults on the command line
ahead of the user's flags (absl keeps the last value of a flag given twice), so a README line trains what it
trains there (``--interaction cross``: DLRM with cross layers over the bottom MLP's output and the embeddings,
:class:`tf_dlrm.models.layers.interaction.CrossInteraction`). No TensorFlow here.
"""

from __future__ import annotations

# The flags each script defines with a default of its own (NVIDIA's dlrm.py and dcnv2.py, 23.02), given as
# NVIDIA's flags: they mean here what they mean there (docs/training.md, "Coming from NVIDIA's DLRM").
_SHARED = ["--batch_size", "65536", "--valid_batch_size", "65536", "--top_mlp_dims", "1024,1024,512,256,1",
           "--bottom_mlp_dims", "512,256,128", "--embedding_dim", "128", "--decay_start_step", "48000",
           "--decay_steps", "24000", "--loss_scale", "65536"]  # loss_scale: NVIDIA main.py's, for both scripts
SCRIPT_DEFAULTS = {
    "dlrm.py": _SHARED + ["--optimizer", "sgd", "--interaction", "dot_custom_cuda", "--learning_rate", "24",
                          "--warmup_steps", "8000"],
    "dcnv2.py": _SHARED + ["--optimizer", "adam", "--interaction", "cross", "--learning_rate", "0.0001",
                           "--warmup_steps", "100", "--num_cross_layers", "3", "--cross_layer_projection_dim", "512"],
}


def script_argv(script: str, argv: list[str]) -> list[str]:
    """``argv`` of NVIDIA's ``script`` as ``main.py``'s: the script's defaults first, then the user's flags."""
    return [argv[0], *SCRIPT_DEFAULTS[script], *argv[1:]]


def user_argv(argv: list[str]) -> list[str]:
    """``argv`` without the defaults :func:`script_argv` put ahead of the user's flags (unchanged for
    ``main.py``): the user's own flags override those defaults by design, so only they are checked for a
    flag given twice."""
    for defaults in SCRIPT_DEFAULTS.values():
        if argv[1:1 + len(defaults)] == defaults:
            return [argv[0], *argv[1 + len(defaults):]]
    return list(argv)
