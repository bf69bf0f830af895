"""The settings of one run of ``main.py``: every other config, and what the run does. Frozen and
validated when made (``tf_dlrm.cli.flags`` makes it once from the flags)."""

from __future__ import annotations

import dataclasses

from tf_dlrm.calibration import METHODS as CALIBRATION_METHODS
from tf_dlrm.cli.model_config import ModelConfig, ShardingConfig
from tf_dlrm.train.loop_config import LoopConfig
from tf_dlrm.optimizers.settings import OptimizerConfig
from tf_dlrm.train.precision import AmpMode


@dataclasses.dataclass(frozen=True)
class RunConfig:
    mode: str
    dataset_path: str | None
    feature_spec: str
    dataset_type: str
    batch_size: int
    valid_batch_size: int
    seed: int
    amp: AmpMode
    xla: bool
    log_path: str | None
    tensorboard_dir: str | None
    inter_op_parallelism: int
    intra_op_parallelism: int
    train_split: str
    valid_split: str
    save_checkpoint_path: str | None
    restore_checkpoint_path: str | None
    model: ModelConfig
    sharding: ShardingConfig
    optimizer: OptimizerConfig
    loop: LoopConfig
    checkpoint_every_steps: int = 0
    keep_checkpoints: int = 2
    # --delta_every_steps, --delta_dir: a delta (the rows changed since the last one, the dense weights) every this many
    # steps (tf_dlrm.checkpoint.deltas); 0: none.
    delta_every_steps: int = 0
    delta_dir: str | None = None
    resume: bool = False
    # --restart_if_all_corrupt: a --resume that finds only corrupt checkpoints starts over instead of stopping.
    restart_if_all_corrupt: bool = False
    # --stop_timeout_s: after a stop signal, how long a training step may take before the process ends unsaved.
    stop_timeout_s: float = 60.0
    saved_model_path: str | None = None
    # --bf16_dense_allreduce: average the MLP gradients as bfloat16 under --amp (bfloat16).
    bf16_dense_allreduce: bool = False
    inference_batch_sizes: tuple[int, ...] = (1, 64, 1024, 4096)
    keep_best: bool = False
    # --horovod_cycle_time_ms: None is auto (tf_dlrm.cli.cycle_time).
    horovod_cycle_time_ms: float | None = None
    # --test_split: evaluated once at the end, at the state selection chose ('' or none: none; auto: resolved
    # against the dataset's splits with --valid_split, tf_dlrm.cli.evaluation_splits).
    test_split: str = ""
    # --select_on_test: selection may choose by the test split when it is the evaluated one.
    select_on_test: bool = False
    # --log_format: jsonl (tf_dlrm's events) or dllogger (NVIDIA's records, tf_dlrm.train.dllogger_log).
    log_format: str = "jsonl"
    # Every flag's value, the PARAMETER record of a DLLogger log (compare=False: not a setting of the run).
    log_parameters: dict | None = dataclasses.field(default=None, compare=False)
    # Lines printed on rank 0 at the start: NVIDIA flags accepted with no effect (tf_dlrm.cli.nvidia_flags).
    notes: tuple[str, ...] = ()
    # --calibration: the map of logits fitted on the validation split at the end of training, saved with the final
    # checkpoint and applied by --mode=eval and export (tf_dlrm.calibration); none: neither fitted nor applied.
    calibration: str = "platt"
    # --cpu: hide every GPU (tf_dlrm.parallel.devices); else one GPU per rank where a host has them.
    cpu: bool = False

    def __post_init__(self):
        if self.batch_size <= 0:
            raise ValueError(f"Expected --batch_size > 0. Received: --batch_size={self.batch_size}")
        if self.valid_batch_size <= 0:
            raise ValueError(f"Expected --valid_batch_size > 0. Received: --valid_batch_size={self.valid_batch_size}")
        if self.dataset_type != "synthetic" and not self.dataset_path:
            raise ValueError(f"--dataset_path is required with --dataset_type={self.dataset_type}")
        if self.test_split not in ("", "none", "auto") and self.test_split == self.valid_split:
            raise ValueError(
                f"Expected --test_split to differ from --valid_split (the validation split selects, the test split "
                f"reports). Received: --test_split={self.test_split} --valid_split={self.valid_split}")
        if self.calibration not in CALIBRATION_METHODS:
            raise ValueError(f"Expected --calibration in {list(CALIBRATION_METHODS)}. Received: --calibration={self.calibration}")
        self._check_checkpoint_flags()

    def _check_checkpoint_flags(self) -> None:
        if self.checkpoint_every_steps < 0:
            raise ValueError(f"Expected --checkpoint_every_steps >= 0. Received: --checkpoint_every_steps={self.checkpoint_every_steps}")
        if self.keep_checkpoints < 1:
            raise ValueError(f"Expected --keep_checkpoints >= 1. Received: --keep_checkpoints={self.keep_checkpoints}")
        if self.resume and not self.save_checkpoint_path:
            raise ValueError("--resume continues from the latest checkpoint under --save_checkpoint_path: give that flag too")
        if not self.stop_timeout_s > 0:
            raise ValueError(f"Expected --stop_timeout_s > 0. Received: --stop_timeout_s={self.stop_timeout_s}")
        if self.restart_if_all_corrupt and not self.resume:
            raise ValueError("--restart_if_all_corrupt says what --resume does when every checkpoint is corrupt: give "
                             "--resume too")
        if self.checkpoint_every_steps and not self.save_checkpoint_path:
            raise ValueError("--checkpoint_every_steps needs --save_checkpoint_path (where to save)")
        if self.delta_every_steps < 0:
            raise ValueError(f"Expected --delta_every_steps >= 0. Received: --delta_every_steps={self.delta_every_steps}")
        if bool(self.delta_every_steps) != bool(self.delta_dir):
            raise ValueError("--delta_every_steps and --delta_dir go together (how often, and where to write the deltas). "
                             f"Received: --delta_every_steps={self.delta_every_steps} --delta_dir={self.delta_dir}")
        if self.mode in ("eval", "export") and not (self.restore_checkpoint_path or self.resume):
            raise ValueError(
                f"--mode={self.mode} needs a checkpoint: give --restore_checkpoint_path=DIR "
                "(or --resume with --save_checkpoint_path)"
            )
        if self.mode == "export" and not self.saved_model_path:
            raise ValueError("--mode=export needs --saved_model_path=DIR (where to write the SavedModel)")
        if self.mode == "inference" and (not self.inference_batch_sizes or any(b <= 0 for b in self.inference_batch_sizes)):
            raise ValueError(f"Expected --inference_batch_sizes to be positive sizes. Received: {list(self.inference_batch_sizes)}")

    def check_world_size(self, world_size: int) -> None:
        if self.sharding.hot_row_sync_every > 1 and world_size < 2:
            raise ValueError(f"--hot_row_sync_every={self.sharding.hot_row_sync_every} needs several ranks (hot-row replicas "
                             f"exist only with N > 1). Received: {world_size} rank; leave the flag at 1")
        sizes = [("batch_size", self.batch_size), ("valid_batch_size", self.valid_batch_size)]
        if self.mode == "inference":
            sizes = [("inference_batch_sizes", size) for size in self.inference_batch_sizes]
        for flag, value in sizes:
            if value % world_size:
                raise ValueError(
                    f"--{flag}={value} does not divide by the number of ranks ({world_size}); "
                    f"use a multiple of {world_size}"
                )
