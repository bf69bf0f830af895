"""The flags of ``--model`` and its hyper-parameters, parsed into :class:`ModelFamilyConfig`."""

from __future__ import annotations

from absl import flags

from tf_dlrm.cli.model_config import parse_dims
from tf_dlrm.models.config import CROSS_STRUCTURES, MODEL_NAMES, ModelFamilyConfig


def define_model_flags() -> None:
    f = flags
    f.DEFINE_enum("model", "dlrm", list(MODEL_NAMES), "Model on the sharded embedding: dlrm (bottom MLP, --interaction, top "
                  "MLP), dcnv2 (cross network + deep MLP), deepfm (first order + FM + deep MLP), wide_deep (wide linear "
                  "part over ids and the spec's crossed_features + deep MLP).")
    f.DEFINE_integer("num_cross_layers", 3, "--model=dcnv2: cross layers.")
    f.DEFINE_integer("cross_low_rank", 0, "--model=dcnv2: rank r of each cross matrix W = U V (0: full rank).")
    f.DEFINE_enum("cross_structure", "stacked", list(CROSS_STRUCTURES),
                  "--model=dcnv2: deep MLP after the cross network (stacked) or beside it (parallel).")
    f.DEFINE_string("wide_optimizer", "", "--model=wide_deep: sparse optimizer of the wide tables, ftrl or adagrad "
                    "(empty: --embedding_optimizer); the Wide & Deep paper used FTRL.")
    f.DEFINE_float("wide_learning_rate", 0.0, "--model=wide_deep: base rate of --wide_optimizer on the schedule "
                   "(0: the embedding optimizer's rate).")
    f.DEFINE_string("deep_mlp_dims", "512,256", "dcnv2, deepfm, wide_deep: hidden widths of the deep MLP (a one-unit "
                    "logit layer follows).")


def model_family_from_flags(values: flags.FlagValues) -> ModelFamilyConfig:
    return ModelFamilyConfig(model=values.model, num_cross_layers=values.num_cross_layers,
                             cross_low_rank=values.cross_low_rank, cross_structure=values.cross_structure,
                             deep_mlp_dims=parse_dims(values.deep_mlp_dims, "deep_mlp_dims"),
                             wide_optimizer=values.wide_optimizer, wide_learning_rate=values.wide_learning_rate)
