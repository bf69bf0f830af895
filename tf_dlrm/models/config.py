"""Which model to train and its hyper-parameters: one frozen, TensorFlow-free config.

``--model`` picks one of the models built on the same sharded embedding (:mod:`tf_dlrm.models`):

- ``dlrm``: bottom MLP, dot (or cat) interaction, top MLP (the ``ModelConfig`` flags);
- ``dcnv2``: DCN-V2, a cross network over ``[numerical, embeddings]`` stacked before, or in
  parallel with, a deep MLP (``--num_cross_layers``, ``--cross_low_rank``, ``--cross_structure``,
  ``--deep_mlp_dims``);
- ``deepfm``: first-order weights (width-1 tables) + FM second-order term + deep MLP;
- ``wide_deep``: a wide linear part over the categorical ids and the spec's crossed features
  (width-1 tables) + deep MLP.
"""

from __future__ import annotations

import dataclasses
import enum


class ModelName(str, enum.Enum):
    DLRM = "dlrm"
    DCNV2 = "dcnv2"
    DEEPFM = "deepfm"
    WIDE_DEEP = "wide_deep"


class CrossStructure(str, enum.Enum):
    STACKED = "stacked"  # deep MLP on the cross network's output
    PARALLEL = "parallel"  # cross network and deep MLP side by side on x0, outputs concatenated


MODEL_NAMES = tuple(m.value for m in ModelName)
# Base rate of the embedding optimizer when --embedding_learning_rate is not given (nor --learning_rate),
# for the models whose embeddings reach the logit only through the deep MLP's first layer (and, for
# DeepFM, the FM term): there one step of a D-wide embedding moves the logit about as much as one
# step of a width-1 weight, while DLRM's dot products and DCNv2's x0 * (W x + b) multiply embeddings
# by other learnt vectors. At the flag's 0.003 they learn too slowly in a short run (benchmarks/quality.py,
# README "Model quality", has the AUCs that chose 0.01). Chosen with lazy_adam, the default embedding
# optimizer, and applied with it only; other models and optimizers use the flag's default.
MODEL_EMBEDDING_LEARNING_RATES = {"deepfm": 0.01, "wide_deep": 0.01}
CROSS_STRUCTURES = tuple(s.value for s in CrossStructure)
# Sparse optimizers Wide & Deep's wide tables may use instead of the embedding optimizer
# ("": the embedding optimizer); the paper trained its wide part with FTRL.
WIDE_OPTIMIZERS = ("", "ftrl", "adagrad")


@dataclasses.dataclass(frozen=True)
class ModelFamilyConfig:
    """Args:
        model: one of :data:`MODEL_NAMES`.
        num_cross_layers: DCNv2 cross layers (>= 1).
        cross_low_rank: DCNv2: 0 for full-rank cross matrices, else their rank.
        cross_structure: DCNv2: ``stacked`` or ``parallel``.
        deep_mlp_dims: hidden widths of the deep MLP of dcnv2, deepfm and wide_deep (a last layer of
            one unit, the logit, is added after them).
        wide_optimizer: wide_deep: the sparse optimizer of the wide tables (``ftrl``, ``adagrad``; ``""``:
            the embedding optimizer).
        wide_learning_rate: wide_deep: base rate of ``wide_optimizer`` on the schedule (0: the
            embedding optimizer's rate).
    """

    model: str = ModelName.DLRM.value
    num_cross_layers: int = 3
    cross_low_rank: int = 0
    cross_structure: str = CrossStructure.STACKED.value
    deep_mlp_dims: tuple[int, ...] = (512, 256)
    wide_optimizer: str = ""
    wide_learning_rate: float = 0.0

    def __post_init__(self):
        if self.model not in MODEL_NAMES:
            raise ValueError(f"Expected --model in {list(MODEL_NAMES)}. Received: --model={self.model!r}")
        if self.cross_structure not in CROSS_STRUCTURES:
            raise ValueError(f"Expected --cross_structure in {list(CROSS_STRUCTURES)}. Received: --cross_structure={self.cross_structure!r}")
        if isinstance(self.num_cross_layers, bool) or not isinstance(self.num_cross_layers, int) or self.num_cross_layers < 1:
            raise ValueError(f"Expected --num_cross_layers >= 1. Received: --num_cross_layers={self.num_cross_layers!r}")
        if isinstance(self.cross_low_rank, bool) or not isinstance(self.cross_low_rank, int) or self.cross_low_rank < 0:
            raise ValueError(f"Expected --cross_low_rank >= 0 (0: full rank). Received: --cross_low_rank={self.cross_low_rank!r}")
        dims = tuple(self.deep_mlp_dims)
        if not dims or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in dims):
            raise ValueError(f"Expected --deep_mlp_dims to be positive widths. Received: --deep_mlp_dims={list(dims)}")
        object.__setattr__(self, "deep_mlp_dims", dims)
        if self.wide_optimizer not in WIDE_OPTIMIZERS:
            raise ValueError(f"Expected --wide_optimizer in {[o for o in WIDE_OPTIMIZERS if o]} (or empty: the embedding "
                             f"optimizer). Received: --wide_optimizer={self.wide_optimizer!r}")
        if self.wide_learning_rate < 0:
            raise ValueError(f"Expected --wide_learning_rate >= 0. Received: --wide_learning_rate={self.wide_learning_rate}")
        if (self.wide_optimizer or self.wide_learning_rate) and self.model != ModelName.WIDE_DEEP.value:
            raise ValueError(f"--wide_optimizer and --wide_learning_rate apply to --model=wide_deep only. Received: --model={self.model}")

    def default_embedding_learning_rate(self, embedding_optimizer: str, flag_default: float) -> float:
        """The embedding optimizer's base rate when no rate flag is given (:data:`MODEL_EMBEDDING_LEARNING_RATES`,
        for ``lazy_adam``; else ``flag_default``)."""
        if embedding_optimizer != "lazy_adam":
            return flag_default
        return MODEL_EMBEDDING_LEARNING_RATES.get(self.model, flag_default)

    @property
    def uses_expanded_features(self) -> bool:
        """Models that read width-1 tables next to the deep ones (derived from the same ids)."""
        return self.model in (ModelName.DEEPFM.value, ModelName.WIDE_DEEP.value)

    def record(self) -> dict:
        """Plain data for checkpoint manifests (what the weights' shapes depend on)."""
        return {"model": self.model, "num_cross_layers": self.num_cross_layers, "cross_low_rank": self.cross_low_rank,
                "cross_structure": self.cross_structure, "deep_mlp_dims": list(self.deep_mlp_dims),
                "wide_optimizer": self.wide_optimizer, "wide_learning_rate": self.wide_learning_rate}
