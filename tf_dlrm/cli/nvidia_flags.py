"""NVIDIA's command lines: the flags of DeepLearningExamples' TF2 DLRM (``DLRM_and_DCNv2`` 23.02 and
the 22.06 ``DLRM``) that ``main.py`` does not share, and what each means here.

A flag named like NVIDIA's either means what it means there, or the run is refused before any work
with one line naming the tf_dlrm flag to use: a command line copied from NVIDIA's README never
trains something else without a word. docs/training.md ("Coming from NVIDIA's DLRM") lists them all.
"""

from __future__ import annotations

import json
import os

from absl import flags

# NVIDIA's spellings of values of shared flags, and the tf_dlrm value each means. DLE builds its
# embedding with strategy='memory_balanced' whatever --dist_strategy says (the flag is never read
# there), so each of its values means the memory-balancing planner, tf_dlrm's auto.
VALUE_ALIASES = {
    "interaction": {"dot_custom_cuda": "dot", "dot_tensorflow": "dot"},
    "dist_strategy": {"memory_balanced": "auto", "basic": "auto", "memory_optimized": "auto"},
}
# Flags of NVIDIA's scripts with no counterpart here: refused when given, with what to use instead.
REFUSED = {
    "run_eagerly": "debugging switch of NVIDIA's script; tf_dlrm has none (steps always run as tf.function)",
    "tfdata_debug": "debugging switch of NVIDIA's script; tf_dlrm has none",
    "embedding_zeros_initializer": "zero tables are not offered; use --embedding_init=B (uniform in [-B, B]) "
                                   "or --embedding_init=sqrt_rows",
    "cpu_offloading_threshold_gb": "tables are not offloaded by size here; --memory_per_rank refuses a plan that "
                                   "needs more than a rank may hold",
    "profiler_start_step": "no profiler flag here; use --tensorboard_dir for scalars, or run under a profiler",
    "profiled_rank": "no profiler flag here; use --tensorboard_dir for scalars, or run under a profiler",
    "synthetic_dataset_use_feature_spec": "synthetic data is generated from a feature spec by "
                                          "`python -m tf_dlrm.data.synthetic`; --dataset_type=synthetic draws "
                                          "random batches of --dataset_path's spec",
    "synthetic_dataset_train_batches": "write synthetic files with `python -m tf_dlrm.data.synthetic` "
                                       "(its sizes are its own flags)",
    "synthetic_dataset_valid_batches": "write synthetic files with `python -m tf_dlrm.data.synthetic` "
                                       "(its sizes are its own flags)",
    "synthetic_dataset_cardinalities": "cardinalities come from the feature spec (--dataset_path, --feature_spec)",
    "synthetic_dataset_hotness": "hotness comes from the feature spec (--dataset_path, --feature_spec)",
    "synthetic_dataset_num_numerical_features": "numerical features come from the feature spec "
                                                "(--dataset_path, --feature_spec)",
    # NVIDIA's 22.06 TF2 DLRM.
    "dummy_model": "no dummy model here; --max_steps and --mode=inference time the real one",
    "fp16": "use --amp (mixed precision)",
    "save_input_signature": "use --mode=export --saved_model_path=DIR (the serving signature is in docs/)",
    "saved_model_output_path": "use --mode=export --saved_model_path=DIR",
    "saved_model_input_path": "a SavedModel is not trained from; use --restore_checkpoint_path=DIR",
    "tf_gpu_memory_limit_gb": "no GPU memory cap here; --memory_per_rank bounds the embedding memory per rank",
}

# NVIDIA's boolean flags among those (``--fp16`` and ``--nofp16`` parse, to be refused by name).
_SWITCHES = {"run_eagerly", "tfdata_debug", "embedding_zeros_initializer", "synthetic_dataset_use_feature_spec",
             "dummy_model", "fp16", "save_input_signature"}

# Flags that choose an implementation of the same arithmetic on NVIDIA's GPUs: accepted, no effect.
NO_EFFECT = {
    "use_mde_embeddings": "tf_dlrm's own distributed embedding always serves the tables",
    "concat_embedding": "one process already keeps its tables in one fused variable",
    "data_parallel_bottom_mlp": "the MLPs are always data-parallel here",
    "cpu_embedding_type": "tf_dlrm's own distributed embedding always serves the tables",
    "gpu_embedding_type": "tf_dlrm's own distributed embedding always serves the tables",
}


def define_nvidia_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines NVIDIA's flags that tf_dlrm has no flag of its own for (every one defaults to None:
    not given, tf_dlrm's defaults apply)."""
    for name in REFUSED:
        define = flags.DEFINE_bool if name in _SWITCHES else flags.DEFINE_string
        define(name, None, f"NVIDIA's flag, refused here: {REFUSED[name]}.", flag_values=flag_values)
    for name in ("use_mde_embeddings", "concat_embedding", "data_parallel_bottom_mlp"):
        flags.DEFINE_bool(name, None, f"NVIDIA's flag, accepted with no effect: {NO_EFFECT[name]}.", flag_values=flag_values)
    for name in ("cpu_embedding_type", "gpu_embedding_type"):
        flags.DEFINE_string(name, None, f"NVIDIA's flag, accepted with no effect: {NO_EFFECT[name]}.", flag_values=flag_values)
    flags.DEFINE_float("beta1", None, "NVIDIA's name of --adam_beta1 (beta_1 of adam and lazy_adam).", flag_values=flag_values)
    flags.DEFINE_float("beta2", None, "NVIDIA's name of --adam_beta2 (beta_2 of adam and lazy_adam).", flag_values=flag_values)
    flags.DEFINE_integer("auc_thresholds", None, "NVIDIA's AUC bucket count; ignored (with a note): tf_dlrm computes "
                         "the exact AUC.", flag_values=flag_values)
    flags.DEFINE_bool("embedding_trainable", None, "NVIDIA's flag: true (its default) is accepted; false (frozen "
                      "tables) is refused.", flag_values=flag_values)
    flags.DEFINE_integer("cross_layer_projection_dim", None, "NVIDIA's name of --cross_low_rank (--interaction=cross, --model=dcnv2): the "
                         "rank of each cross layer's W = U V.", flag_values=flag_values)
    flags.DEFINE_bool("columnwise_split", None, "NVIDIA 22.06's flag: true means --dist_strategy=column_wise.",
                      flag_values=flag_values)
    flags.DEFINE_string("dot_interaction", None, "NVIDIA 22.06's flag: custom_cuda or tensorflow mean "
                        "--interaction=dot.", flag_values=flag_values)


def normalized_value(flag: str, value):
    """A shared flag's value in tf_dlrm's spelling (NVIDIA's aliases replaced)."""
    return VALUE_ALIASES.get(flag, {}).get(value, value)


def check_nvidia_flags(values: flags.FlagValues) -> list[str]:
    """Raises ValueError (one line naming the flag and what to use) for an NVIDIA flag or value this
    project does not honour; returns the notes to print for those accepted with no effect."""
    for name, reason in REFUSED.items():
        # A switch given false (--nofp16) asks for NVIDIA's default, which is tf_dlrm's behaviour.
        if values[name].present and (name not in _SWITCHES or values[name].value):
            raise ValueError(f"--{name} (NVIDIA's flag) is not supported: {reason}")
    if values["embedding_trainable"].present and not values["embedding_trainable"].value:
        raise ValueError("--noembedding_trainable (NVIDIA's frozen tables) is not supported: tables always train here")
    dot = values["dot_interaction"].value
    if dot is not None and dot not in ("custom_cuda", "tensorflow"):
        raise ValueError(f"Expected --dot_interaction (NVIDIA 22.06) to be custom_cuda or tensorflow (both mean "
                         f"--interaction=dot). Received: --dot_interaction={dot}")
    if dot is not None and "interaction" in values and normalized_value("interaction", values["interaction"].value) != "dot":
        raise ValueError(f"--dot_interaction (NVIDIA 22.06) means --interaction=dot. "
                         f"Received: --interaction={values['interaction'].value}")
    crossing = values["model"].value == "dcnv2" or (values["model"].value == "dlrm" and values["interaction"].value == "cross")
    if values["cross_layer_projection_dim"].present and not crossing:
        raise ValueError(f"--cross_layer_projection_dim applies to cross layers: use --interaction=cross (NVIDIA's DCNv2) "
                         f"or --model=dcnv2, where it sets --cross_low_rank. Received: --model={values['model'].value}, "
                         f"--interaction={values['interaction'].value}")
    notes = [f"--{name} accepted with no effect: {reason}" for name, reason in NO_EFFECT.items() if values[name].present]
    if values["auc_thresholds"].present:
        notes.append("--auc_thresholds ignored: tf_dlrm computes the exact AUC (no threshold buckets)")
    return notes


def parse_embedding_dim(text) -> tuple[int, tuple[int, ...]]:
    """``--embedding_dim`` as NVIDIA reads it: one width (``128``), one width per categorical feature
    in spec order (``128,64,...``), or a JSON file holding that list. Returns ``(width, widths)``:
    ``widths`` is empty for one width, else ``width`` is its first (as NVIDIA's checks use)."""
    text = str(text).strip()
    # A list of numbers is read as one even where a file of that name exists.
    if not all(part.strip().isdigit() for part in text.split(",")) and os.path.isfile(text):
        try:
            with open(text) as handle:
                parts = json.load(handle)
        except (OSError, ValueError) as error:
            raise ValueError(f"Expected --embedding_dim's file {text} to hold a JSON list of widths. Received: {error}") from None
        if not isinstance(parts, list):
            raise ValueError(f"Expected --embedding_dim's file {text} to hold a JSON list of widths. "
                             f"Received: {type(parts).__name__}")
    else:
        parts = text.split(",")
    try:
        widths = tuple(int(str(part).strip()) for part in parts)
    except ValueError:
        widths = ()
    if not widths or any(width < 1 for width in widths):
        raise ValueError(f"Expected --embedding_dim as a positive width, a comma-separated list of them (one per "
                         f"categorical feature), or a JSON file of that list. Received: --embedding_dim={text}")
    return (widths[0], ()) if len(widths) == 1 else (widths[0], widths)


def embedding_optimizer_of(values: flags.FlagValues) -> str:
    """``--embedding_optimizer``, or, when only ``--optimizer`` is given, the sparse optimizer of its
    family: NVIDIA's ``--optimizer`` trains the tables too (sgd: SGD, adam: lazy Adam)."""
    if values["embedding_optimizer"].present or not values["optimizer"].present:
        return values["embedding_optimizer"].value
    # lamb's trust ratio is per weight matrix, not per table row: its tables keep the Adam family.
    return {"sgd": "sgd", "adam": "lazy_adam", "adagrad": "adagrad", "lamb": "lazy_adam"}[values["optimizer"].value]


def adam_beta(values: flags.FlagValues, which: int) -> float:
    """``--adam_betaN``, or NVIDIA's ``--betaN`` when that is given (both given: they must agree)."""
    own, nvidia = values[f"adam_beta{which}"], values[f"beta{which}"]
    if nvidia.present and own.present and nvidia.value != own.value:
        raise ValueError(f"--beta{which} is NVIDIA's name of --adam_beta{which}: give one. "
                         f"Received: --beta{which}={nvidia.value} --adam_beta{which}={own.value}")
    return nvidia.value if nvidia.present else own.value


def strategy_of(values: flags.FlagValues) -> str:
    """``--dist_strategy`` in tf_dlrm's terms; NVIDIA 22.06's ``--columnwise_split`` means column_wise."""
    strategy = normalized_value("dist_strategy", values["dist_strategy"].value)
    if values["columnwise_split"].value:
        if values["dist_strategy"].present and strategy != "column_wise":
            raise ValueError(f"--columnwise_split (NVIDIA 22.06) means --dist_strategy=column_wise. "
                             f"Received: --dist_strategy={values['dist_strategy'].value}")
        return "column_wise"
    return strategy


def inference_batch_sizes_of(values: flags.FlagValues) -> str:
    """NVIDIA's ``--mode=inference`` times ``--valid_batch_size``; so does tf_dlrm's when that is given and
    ``--inference_batch_sizes`` is not."""
    if values["mode"].value == "inference" and values["valid_batch_size"].present and not values["inference_batch_sizes"].present:
        return str(values["valid_batch_size"].value)
    return values["inference_batch_sizes"].value
