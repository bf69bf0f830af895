"""The command-line flags of ``main.py`` (names follow NVIDIA's TF2 DLRM), parsed once into configs."""

from __future__ import annotations

import dataclasses
import contextlib
import functools

from absl import flags

from tf_dlrm.calibration import METHODS as CALIBRATION_METHODS
from tf_dlrm.cli.embedding_dims import parse_width_mapping
from tf_dlrm.cli.model_config import ModelConfig, ShardingConfig, parse_dims, parse_embedding_init
from tf_dlrm.embedding.optimizers import DEFAULT_OPTIMIZER
from tf_dlrm.embedding.planning import DEFAULT_DATA_PARALLEL_ROWS
from tf_dlrm.embedding.table_config import DEFAULT_INIT_BOUND
from tf_dlrm.sharding.memory_plan import parse_bytes
from tf_dlrm.cli.cycle_time import parse_cycle_time
from tf_dlrm.cli.run_config import RunConfig  # noqa: F401 (imported from here by cli and users)
from tf_dlrm.optimizers.settings import EMBEDDING_OPTIMIZERS, OPTIMIZERS, LearningRateSchedule, OptimizerConfig
from tf_dlrm.train.loop_config import LoopConfig
from tf_dlrm.train.precision import AmpMode
from tf_dlrm.cli.model_flags import define_model_flags, model_from_flags
from tf_dlrm.cli import nvidia_flags

MODES = ("train", "eval", "inference", "export")


class _AmpParser(flags.ArgumentParser):
    """``--amp`` / ``--noamp`` as a boolean flag, plus ``--amp=auto``."""

    def parse(self, argument):
        return AmpMode.parse(argument).value

    def flag_type(self):
        return "true|false|auto"


class _AmpFlag(flags.Flag):
    def _serialize(self, value):
        return f"--{self.name}={value}"


def define_amp_flag(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    flags.DEFINE_flag(_AmpFlag(
        _AmpParser(), flags.ArgumentSerializer(), "amp", "false",
        "Mixed precision: mixed_float16 with loss scaling on GPU, mixed_bfloat16 on CPU. --amp (true) uses bf16 "
        "even where the CPU only emulates it (with a notice); --amp=auto uses it only where the CPU runs it "
        "natively (AVX-512 BF16 or AMX), else float32.",
        boolean=True,
    ), flag_values=flag_values)


# The topics `python main.py --help` and docs/flags.md group the flags by, in this order.
TOPICS = ("data", "training", "model", "sharding", "optimizers", "checkpoints", "evaluation", "runtime", "nvidia_compatibility")
TOPIC_OF: dict[str, str] = {}  # flag name -> topic, filled by define_flags


@contextlib.contextmanager
def _topic(name: str, flag_values: flags.FlagValues):
    """Files the flags defined inside the block under topic ``name``."""
    before = set(flag_values)
    yield
    for flag in set(flag_values) - before:
        TOPIC_OF[flag] = name


def define_flags(argv=None, flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines every flag of ``main.py`` in ``flag_values``, by topic (:data:`TOPIC_OF`); ``argv``: the command
    line, read only for a ``--model`` given by import path, whose own flags are defined too
    (:mod:`tf_dlrm.cli.model_flags`)."""
    f = _Definer(flag_values)
    with _topic("data", flag_values):
        f.DEFINE_string("dataset_path", None, "Directory of the dataset (split_binary files + feature spec).")
        f.DEFINE_string("feature_spec", "feature_spec.yaml", "Feature spec file, relative to --dataset_path unless absolute.")
        f.DEFINE_enum("dataset_type", "tf_raw", ["tf_raw", "split_tfrecords", "synthetic"],
                      "tf_raw: split_binary files; split_tfrecords: NVIDIA DLRM_and_DCNv2's pre-batched TFRecords "
                      "(<dataset>/<split>/categorical_<i>/...); synthetic: random batches of the spec's shape made in memory "
                      "(benchmarking without disk; random labels).")
        f.DEFINE_string("train_split", "train", "source_spec split to train on.")
        f.DEFINE_string("valid_split", "auto", "source_spec split evaluated during training, the one --keep_best, "
                        "--early_stopping_patience and --auc_threshold choose by; auto: the dataset's validation split "
                        "(validation, valid or val), else its test split, evaluated but never chosen on (see --select_on_test); "
                        "'' or none: no evaluation. A split the spec does not have, or an empty one, is refused before training.")
        f.DEFINE_string("test_split", "auto", "source_spec split evaluated once at the end, at the state --valid_split chose, "
                        "and reported as test_auc etc.; it never chooses. auto: test, unless it is the --valid_split; '' or "
                        "none: no test split; must differ from --valid_split; --mode=eval reports it too.")
        f.DEFINE_bool("select_on_test", False, "Let --keep_best, --early_stopping_patience and --auc_threshold choose by "
                      "the test split when it is the evaluated split (a dataset without a validation split, or "
                      "--valid_split=test); its figures then overstate the model's on new data. Without it they are refused there.")
    with _topic("training", flag_values):
        f.DEFINE_enum("mode", "train", list(MODES), "What to do: train; eval: a checkpoint's metrics on the validation "
                      "split; inference: time predictions per --inference_batch_sizes; export: a TF SavedModel for serving "
                      "(docs/serving.md).")
        f.DEFINE_integer("batch_size", 4096, "Global training batch size (all ranks together); must divide by the number of ranks.")
        f.DEFINE_float("epochs", 1.0, "Epochs to train (fractions allowed).")
        f.DEFINE_integer("max_steps", -1, "Stop after this many steps (-1: no limit); --mode=inference: timed batches per size.")
        f.DEFINE_integer("seed", 12345, "Seed of weights and data order.")
    with _topic("model", flag_values):
        f.DEFINE_string("embedding_dim", "128", "Embedding dimension of every table (unless the spec or --embedding_dims "
                        "says); as NVIDIA's, also one width per categorical feature in spec order (128,64,...) or a JSON "
                        "file of that list, which overrides the spec's widths (--embedding_dims still wins).")
        f.DEFINE_string("embedding_dims", "", "Per-table widths, e.g. cat_0.bin:16,cat_3.bin:64 (overrides the spec's "
                        "embedding_dim and --embedding_dim; DLRM's dot interaction needs one width, --interaction=cat does not).")
        f.DEFINE_string("embedding_init", str(DEFAULT_INIT_BOUND), "Initial embedding values: uniform in [-b, b] "
                        "for this b, or sqrt_rows for b = 1/sqrt(rows) of each table (the DLRM reference's init); dynamic "
                        "tables too.")
        f.DEFINE_integer("embedding_min_count", 1, "Rare ids: a table row is updated only from the training step that "
                         "looks it up for the min_count-th time (before, it keeps its initial values); 1: from the first. Not on "
                         "dynamic tables (a dynamic feature's min_count admits its keys). Neither this nor --embedding_frequency_l2 "
                         "given, a model may choose both (--model=dcnv2: 2 and 25; its default_frequency_regularizer).")
        f.DEFINE_float("embedding_frequency_l2", 0.0, "Rare ids: l2 * w / (count * global batch) added to the gradient "
                       "of each touched table row, count = the training steps that looked the row up (rare rows pulled "
                       "towards zero; per sample, as the loss is a batch mean); 0: off. 25 with --embedding_min_count=2 did best on the "
                       "KDD 2012 sample (benchmarks/results/quality_real.md), and is --model=dcnv2's default when neither flag is given.")
        define_model_flags(argv, flag_values=flag_values)
    with _topic("sharding", flag_values):
        f.DEFINE_enum("dist_strategy", "auto", ["auto", "table_wise", "column_wise", *nvidia_flags.VALUE_ALIASES["dist_strategy"]],
                      "How embedding tables are sharded (NVIDIA's memory_balanced, basic and memory_optimized mean auto).")
        f.DEFINE_integer("column_slice_threshold", None, "Tables with more elements than this are column-sliced.")
        f.DEFINE_integer("row_slice_threshold", None, "Tables with more elements than this are cut into row bands over every "
                         "rank (NVIDIA's flag and meaning; before column slicing); none by default (NVIDIA's scripts: 10^10).")
        f.DEFINE_integer("data_parallel_threshold", None, "Tables with fewer elements (rows x width) than this are "
                         "replicated (data-parallel), as NVIDIA's flag; given, --data_parallel_rows applies only if given too "
                         "(--data_parallel_rows counts rows).")
        f.DEFINE_integer("data_parallel_rows", DEFAULT_DATA_PARALLEL_ROWS, "Tables with fewer rows are replicated (data-parallel).")
        f.DEFINE_bool("data_parallel_input", False, "Read local batches of every feature and exchange ids with one alltoall.")
        f.DEFINE_float("hot_rows_budget", 0.0, "Replicate the most looked-up rows of the model-parallel tables on every rank, "
                       "up to this fraction of their memory (0: off; only cold rows travel). Several ranks, one-hot features, fixed "
                       "tables, a model reading the spec's columns as they are (not deepfm or wide_deep), no "
                       "--data_parallel_input or --deduplicate_exchange. Id counts from id_counts.npz next to the training "
                       "data (rank 0 writes it when missing); logs the plan and the measured hit rates and bytes.")
        f.DEFINE_float("hot_rows_min_per_step", 0.0, "With --hot_rows_budget: replicate only rows looked up at least this "
                       "often per global batch on average (about the number of ranks is where replication starts to pay).")
        f.DEFINE_string("memory_per_rank", "0", "Refuse, before anything is allocated, a sharding plan whose embedding tables, "
                        "their optimizer state and hot-row replicas need more than this on some rank (8GiB, 1500MiB, 800MB or bytes; 0: "
                        "no budget of your own), and, before the first step, a model whose dense weights and their optimizer "
                        "state take it over; the error names each rank over it. Every run also checks the plan against the "
                        "memory of each host and memory cgroup, and prints and logs (memory_plan) what each rank will hold.")
        f.DEFINE_integer("hot_row_sync_every", 1, "With --hot_rows_budget and several ranks: each rank updates its hot-row "
                         "replicas with its own gradients and the ranks merge the accumulated changes every this many steps "
                         "(and before evaluation, checkpoints and the end); 1: the gradients are combined every step (exact). "
                         "Refused below 1, without --hot_rows_budget or with one rank.")
        f.DEFINE_bool("deduplicate_exchange", False, "Send each rank one embedding row per distinct id of its samples (plus an "
                      "index per sample) instead of one per sample: fewer alltoall bytes when ids repeat; the same model. Needs one-hot "
                      "features, fixed tables, a model reading the spec's columns as they are (not deepfm or wide_deep), no "
                      "--data_parallel_input, and every rank owning a slice (more model-parallel tables than ranks, or "
                      "--dist_strategy=column_wise); else refused before training.")
        f.DEFINE_bool("split_embedding_tables", False, "Under --amp (bfloat16): store each model-parallel table's float32 "
                      "weights as two 16-bit halves; lookups and the exchange read the bf16 upper half, the update joins "
                      "both into float32 (the same memory as float32 tables, the same update). Replicated tables stay float32. "
                      "Refused without bfloat16 compute, with --hot_rows_budget or --deduplicate_exchange, with a --model "
                      "other than dlrm, and with dynamic tables.")
    with _topic("optimizers", flag_values):
        f.DEFINE_float("learning_rate", 0.001, "Base of the learning-rate schedule. Given on the command line, it is also the "
                       "rate of each optimizer whose own rate flag (--dense_learning_rate, --embedding_learning_rate) is "
                       "not given (or 0); else those flags' tuned defaults apply.")
        # Defaults chosen by benchmarks/sweep_defaults.py (benchmarks/results/model_quality.md).
        f.DEFINE_enum("optimizer", "adam", list(OPTIMIZERS), "Optimizer of the MLPs, on the gradient averaged over ranks; "
                      "given without --embedding_optimizer, also the tables' (as NVIDIA's: sgd -> sgd, adam -> lazy_adam, "
                      "adagrad -> adagrad, lamb -> lazy_adam). lamb: Adam's moments with a per-layer trust ratio ||w||/||u|| "
                      "(You et al. 2019).")
        f.DEFINE_float("dense_learning_rate", 0.001, "Base learning rate of the MLPs' optimizer, on the schedule of "
                       "--learning_rate; 0, or not given while --learning_rate is: --learning_rate. Adam wants about 1e-3, SGD about 0.5.")
        # catch_up_adam: dense Adam's model at lazy Adam's cost (benchmarks/results/quality_real.md).
        f.DEFINE_enum("embedding_optimizer", DEFAULT_OPTIMIZER.name, list(EMBEDDING_OPTIMIZERS),
                      "Sparse optimizer of the embedding tables (touched rows only, repeated ids summed first; state sharded "
                      "like the tables); not given: --optimizer's family when that is given. rowwise_adagrad: one "
                      "accumulator per row (exact across column slices); ftrl: FTRL-Proximal (McMahan et al. 2013); "
                      "catch_up_adam (the default): lazy Adam that first applies in closed form the zero-gradient steps "
                      "dense Adam would have applied to a row since its last update (dense Adam's result at lazy Adam's "
                      "cost, one more state slot); lazy_adam: moments and moves of touched rows only (2 state slots, 25% "
                      "less table+state memory than catch_up_adam, for memory-bound tables); dense_adam: every row moves "
                      "every step, as Keras's Adam on an Embedding (small tables only). Compared in "
                      "benchmarks/results/quality_real.md.")
        f.DEFINE_float("embedding_learning_rate", DEFAULT_OPTIMIZER.learning_rate, "Base learning rate of the embedding optimizer, on the schedule of "
                       "--learning_rate; 0, or not given while --learning_rate is: --learning_rate. catch_up_adam and lazy_adam "
                       "want about 3e-3, adagrad 0.1, sgd about 1. Not given, a model may choose its own (--model=deepfm "
                       "and wide_deep: 0.01 with catch_up_adam or lazy_adam; their embedding_learning_rates).")
        f.DEFINE_float("adagrad_initial_accumulator", 0.1, "Initial accumulator of adagrad, rowwise_adagrad and ftrl (embeddings and MLPs).")
        f.DEFINE_float("adagrad_epsilon", 1e-7, "Epsilon of adagrad and rowwise_adagrad.")
        f.DEFINE_float("adam_beta1", 0.9, "beta_1 of adam, lazy_adam and lamb.")
        f.DEFINE_float("adam_beta2", 0.999, "beta_2 of adam, lazy_adam and lamb.")
        f.DEFINE_float("adam_epsilon", 1e-8, "Epsilon of adam, lazy_adam and lamb.")
        f.DEFINE_float("embedding_weight_decay", 0.0, "L2 coefficient on the embedding rows touched in a step (added to their gradient, as one process does); "
                       "under dense_adam on every row at every step, as Keras's Adam under an L2 loss over the table.")
        f.DEFINE_float("dense_weight_decay", 0.0, "L2 coefficient on the MLP weights (LAMB: its weight decay, inside the trust ratio).")
        f.DEFINE_integer("warmup_steps", 0, "Linear learning-rate warmup steps (NVIDIA's schedule: warmup, constant, decay).")
        f.DEFINE_integer("decay_start_step", 0, "Step at which polynomial (power 2) decay starts.")
        f.DEFINE_integer("decay_steps", 0, "Steps of decay to zero (0: no decay).")
    with _topic("checkpoints", flag_values):
        f.DEFINE_string("save_checkpoint_path", None, "Directory to save checkpoints to (ckpt-<step> directories, published atomically).")
        f.DEFINE_string(
            "restore_checkpoint_path", None,
            "Checkpoint to restore: a ckpt-<step> directory, or a directory of them (its latest is used).",
        )
        f.DEFINE_integer("checkpoint_every_steps", 0, "Save a checkpoint every this many steps (0: only at the end).")
        f.DEFINE_integer("keep_checkpoints", 2, "Checkpoints kept under --save_checkpoint_path (older ones are deleted).")
        f.DEFINE_integer("delta_every_steps", 0, "Write a delta (embedding rows changed since the last one, dense weights) "
                         "every this many steps into --delta_dir, for tf_dlrm.cli.apply_deltas (0: none).")
        f.DEFINE_string("delta_dir", None, "Directory of the deltas (delta-<step> directories, published atomically).")
        f.DEFINE_bool(
            "resume", False,
            "Continue from the newest intact checkpoint under --save_checkpoint_path (corrupt newer ones are skipped, "
            "named and moved aside; else from --restore_checkpoint_path, else from scratch); refused when --batch_size "
            "or the training data differ from the checkpoint's; refused when every checkpoint there is corrupt.",
        )
        f.DEFINE_bool(
            "restart_if_all_corrupt", False,
            "With --resume: when every checkpoint under --save_checkpoint_path is corrupt, move them aside and "
            "start from step 0 instead of stopping.",
        )
        f.DEFINE_float(
            "stop_timeout_s", 60.0,
            "After SIGINT or SIGTERM during training: when no step ends within this many seconds (one stuck in the "
            "input reader or a collective), end the process without saving (exit 128 + signal; the last checkpoint "
            "stays intact). Evaluations and saves in progress are not counted.",
        )
        f.DEFINE_string("saved_model_path", None, "--mode=export: directory to write the TF SavedModel to (must not exist, or be empty).")
    with _topic("evaluation", flag_values):
        f.DEFINE_integer("valid_batch_size", None, "Global evaluation batch size (default: --batch_size).")
        f.DEFINE_integer("evals_per_epoch", 1, "Exact evaluations per epoch, and always one at the end (0: only at the end).")
        f.DEFINE_integer("eval_every_steps", 0, "Evaluate every this many steps instead (0: use --evals_per_epoch; "
                         "not both).")
        f.DEFINE_integer("eval_max_batches", 0, "Evaluate only the first this many global batches of the validation "
                         "split (a quick partial evaluation, marked partial in the log and on the console, also in --mode=eval; 0: "
                         "the whole split).")
        f.DEFINE_integer("early_stopping_patience", 0, "Stop after this many evaluations without an improvement of the "
                         "validation --early_stopping_metric by more than --early_stopping_min_delta, and end with the best state "
                         "(implies --keep_best; logs an early_stop event; needs a validation split); 0: off.")
        f.DEFINE_float("early_stopping_min_delta", 0.0, "With --early_stopping_patience: the gain (AUC up, logloss down) an "
                       "evaluation must exceed to count as an improvement.")
        f.DEFINE_enum("early_stopping_metric", "auc", ["auc", "logloss"], "What --early_stopping_patience and --keep_best "
                      "choose by: the validation AUC (ranking), or the validation logloss (ranking and calibration; the "
                      "choice that also minimizes normalized entropy on that split).")
        f.DEFINE_float("auc_threshold", None, "Stop training once validation AUC reaches this.")
        f.DEFINE_bool("keep_best", False, "Keep the state (weights and optimizers) of the evaluation with the best validation "
                      "--early_stopping_metric; restore, report (final JSON: best_step) and save it at the end.")
        f.DEFINE_enum("calibration", "platt", list(CALIBRATION_METHODS), "Post-hoc calibration of the probabilities, "
                      "fitted at the end of training on the validation split (never on a test split) by minimizing its "
                      "logloss: platt: sigmoid(a*logit + b); temperature: sigmoid(logit / T); none: off. Saved with the final "
                      "checkpoint and applied by the final figures, --mode=eval and --mode=export (none: not applied); "
                      "the figures without it are reported beside (uncalibrated_logloss etc.).")
        f.DEFINE_string("inference_batch_sizes", "1,64,1024,4096", "--mode=inference: global batch sizes to time.")
    with _topic("runtime", flag_values):
        define_amp_flag(flag_values)
        f.DEFINE_float("loss_scale", 0.0, "Loss scale for mixed_float16: > 0 static, 0 dynamic (halved on overflow, the step skipped on every rank; "
                       "ignored for float32 and bfloat16).")
        f.DEFINE_bool("xla", False, "Compile the dense part of the step with XLA.")
        f.DEFINE_bool("cpu", False, "Train on the CPU even where the host has GPUs (default: one GPU per rank where "
                      "there are GPUs, each rank seeing only GPU local_rank, memory growth on; more ranks than GPUs on a host is refused; "
                      "tf_dlrm's own kernels are CPU kernels, so TensorFlow's ops run on the GPU). GPU training is not "
                      "yet verified: no machine of this project's CI has a GPU.")
        f.DEFINE_bool("bf16_dense_allreduce", False, "Under --amp (bfloat16) with several ranks: average the MLP gradients as "
                      "bfloat16 (half the bytes, two collectives instead of one; slower over a loopback, see benchmarks/results/performance.md).")
        f.DEFINE_integer("print_freq", 100, "Steps between progress lines (the loss printed and logged is the global "
                         "batch's, the mean over ranks).")
        f.DEFINE_string("log_path", None, "Log file (rank 0), in --log_format.")
        f.DEFINE_enum("log_format", "jsonl", ["jsonl", "dllogger"], "--log_path's format: jsonl (tf_dlrm's events, one "
                      "JSON object a line) or dllogger (NVIDIA's DLLogger records, 'DLLL {json}' lines, as NVIDIA's --log_path).")
        f.DEFINE_string("tensorboard_dir", None, "Directory for TensorBoard scalars (rank 0): loss, learning rate, samples/s, and each "
                        "evaluation's auc, logloss, ne, calibration, positive_rate (test_* for --test_split).")
        f.DEFINE_integer("inter_op_parallelism", 0, "TensorFlow inter-op threads (0: 2, so that independent ops such as the exchange and the bottom MLP overlap).")
        f.DEFINE_integer("intra_op_parallelism", 0, "TensorFlow intra-op threads (0: cores / ranks on this machine).")
        f.DEFINE_string("horovod_cycle_time_ms", "auto", "Horovod's coordination cycle under horovodrun (HOROVOD_CYCLE_TIME): "
                        "milliseconds, or auto: 10 when a rank's MLPs do >= 10M multiply-adds forward per step, else "
                        "Horovod's 1 (an environment's HOROVOD_CYCLE_TIME wins).")
    with _topic("nvidia_compatibility", flag_values):
        nvidia_flags.define_nvidia_flags(flag_values)


class _Definer:
    """``flags.DEFINE_*`` bound to one FlagValues."""

    def __init__(self, flag_values: flags.FlagValues):
        self._flag_values = flag_values

    def __getattr__(self, name: str):
        return functools.partial(getattr(flags, name), flag_values=self._flag_values)


def family_rate(values: flags.FlagValues, name: str, model_default: float | None = None) -> float:
    """The base rate of one optimizer family (``dense_learning_rate`` or ``embedding_learning_rate``).

    Its own flag wins when given; else an explicit ``--learning_rate`` drives it (0 = the schedule's
    base), as it drove every weight before the families had their own rates; else the model's
    default (``model_default``, the model's ``embedding_learning_rates``) or
    the flag's tuned default.
    """
    if values[name].present:
        return values[name].value
    if values["learning_rate"].present:
        return 0.0
    return values[name].value if model_default is None else model_default


def rare_id_settings(values: flags.FlagValues, model_class) -> tuple[int, float]:
    """``(--embedding_min_count, --embedding_frequency_l2)``: the flags when either is given (the other keeps
    its flag's default), else the model's ``default_frequency_regularizer`` (a model by import path may have
    none), else the flags' defaults."""
    default = getattr(model_class, "default_frequency_regularizer", None)
    if default is None or values["embedding_min_count"].present or values["embedding_frequency_l2"].present:
        return values.embedding_min_count, values.embedding_frequency_l2
    return default.min_count, default.l2


_TRUE_WORDS = ("true", "t", "1", "yes", "y")


def _value_of(flag, text: str):
    """A flag's value as its parser reads ``text`` (so ``--x=8`` and ``--x 8`` compare equal); the text
    itself where the parser refuses it (absl names that mistake)."""
    try:
        return flag.parser.parse(text)
    except (ValueError, TypeError):
        return text


def refuse_repeated_flags(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Raises ValueError when a flag is given twice with different values: absl keeps the last one
    without a word, so ``--embedding_dim=8 ... --embedding_dim=4`` trained width 4. A repeat of the same
    value is harmless and accepted (a wrapper such as scripts/train_resilient.sh may add ``--resume`` to
    a command that has it); flags meant to repeat (``DEFINE_multi_*``) are left alone. A flag on the
    command line may override one read from ``--flagfile`` (absl's documented way to vary a saved run),
    so only the command line's own arguments are compared."""
    args = list(argv[1:])
    seen: dict[str, tuple] = {}
    index = 0
    while index < len(args):
        argument = args[index]
        index += 1
        if argument == "--":
            break
        if not argument.startswith("-") or argument == "-":
            continue
        name, has_value, text = argument.lstrip("-").partition("=")
        if name not in flag_values and name.startswith("no") and name[2:] in flag_values \
                and flag_values[name[2:]].boolean and not has_value:
            name, text, has_value = name[2:], "false", True
        if name not in flag_values:
            continue  # absl refuses an unknown flag itself
        flag = flag_values[name]
        if not has_value:
            if flag.boolean:
                text = "true"
            elif index < len(args):
                text, argument = args[index], f"{argument} {args[index]}"
                index += 1
        if isinstance(flag, flags.MultiFlag):
            continue
        value = _value_of(flag, text)
        if flag.boolean and isinstance(value, str) and value.lower() in _TRUE_WORDS:
            value = True
        if name in seen and seen[name][0] != value:
            first = seen[name][1]
            raise ValueError(
                f"--{name} is given twice with different values ({first}, then {argument}); the last one would "
                f"win without a word. Expected each flag once. Received: {first.lstrip('-')} and {argument.lstrip('-')}")
        seen.setdefault(name, (value, argument))


def config_from_flags(values: flags.FlagValues) -> RunConfig:
    """Turns parsed flags into frozen configs; raises ValueError naming the flag on bad values."""
    from tf_dlrm.models import registry

    notes = nvidia_flags.check_nvidia_flags(values)
    name, params = model_from_flags(values)
    if values["cross_layer_projection_dim"].present:
        params = dataclasses.replace(params, cross_low_rank=values.cross_layer_projection_dim)
    embedding_dim, embedding_widths = nvidia_flags.parse_embedding_dim(values.embedding_dim)
    embedding_optimizer = nvidia_flags.embedding_optimizer_of(values)
    elements = values.data_parallel_threshold
    model_class = registry.lookup(name)
    min_count, frequency_l2 = rare_id_settings(values, model_class)
    model = ModelConfig(
        embedding_dim=embedding_dim,
        embedding_widths=embedding_widths,
        name=name,
        params=params,
        embedding_dims=tuple(parse_width_mapping(values.embedding_dims).items()),
        embedding_init_bound=parse_embedding_init(values.embedding_init),
        embedding_min_count=min_count,
        embedding_frequency_l2=frequency_l2,
    )
    model_rate = getattr(model_class, "embedding_learning_rates", {}).get(embedding_optimizer)
    schedule = LearningRateSchedule(values.learning_rate, values.warmup_steps, values.decay_start_step, values.decay_steps)
    return RunConfig(
        mode=values.mode,
        dataset_path=values.dataset_path,
        feature_spec=values.feature_spec,
        dataset_type=values.dataset_type,
        batch_size=values.batch_size,
        valid_batch_size=values.valid_batch_size or values.batch_size,
        seed=values.seed,
        amp=AmpMode.parse(values.amp),
        xla=values.xla,
        cpu=values.cpu,
        bf16_dense_allreduce=values.bf16_dense_allreduce,
        log_path=values.log_path,
        log_format=values.log_format,
        log_parameters=_plain_flags(values),
        notes=tuple(notes),
        tensorboard_dir=values.tensorboard_dir,
        inter_op_parallelism=values.inter_op_parallelism,
        intra_op_parallelism=values.intra_op_parallelism,
        train_split=values.train_split,
        valid_split=values.valid_split,
        save_checkpoint_path=values.save_checkpoint_path,
        restore_checkpoint_path=values.restore_checkpoint_path,
        model=model,
        sharding=ShardingConfig(
            strategy=nvidia_flags.strategy_of(values),
            # NVIDIA's --data_parallel_threshold counts elements; given alone, it replaces the row rule.
            data_parallel_threshold=values.data_parallel_rows if elements is None or values["data_parallel_rows"].present else 0,
            data_parallel_elements=elements,
            column_slice_threshold=values.column_slice_threshold,
            row_slice_threshold=values.row_slice_threshold,
            data_parallel_input=values.data_parallel_input,
            deduplicate_exchange=values.deduplicate_exchange,
            hot_rows_budget=values.hot_rows_budget,
            hot_rows_min_per_step=values.hot_rows_min_per_step,
            memory_per_rank=parse_bytes(values.memory_per_rank),
            hot_row_sync_every=values.hot_row_sync_every,
            split_embedding_tables=values.split_embedding_tables,
        ),
        optimizer=OptimizerConfig(
            schedule, values.optimizer, loss_scale=values.loss_scale, dense_learning_rate=family_rate(values, "dense_learning_rate"),
            embedding_optimizer=embedding_optimizer, embedding_learning_rate=family_rate(
                values, "embedding_learning_rate", model_rate),
            adagrad_initial_accumulator=values.adagrad_initial_accumulator, adagrad_epsilon=values.adagrad_epsilon,
            adam_beta1=nvidia_flags.adam_beta(values, 1), adam_beta2=nvidia_flags.adam_beta(values, 2),
            adam_epsilon=values.adam_epsilon,
            embedding_weight_decay=values.embedding_weight_decay, dense_weight_decay=values.dense_weight_decay,
        ),
        loop=loop_from_flags(values),
        checkpoint_every_steps=values.checkpoint_every_steps,
        keep_checkpoints=values.keep_checkpoints,
        delta_every_steps=values.delta_every_steps,
        delta_dir=values.delta_dir,
        resume=values.resume,
        restart_if_all_corrupt=values.restart_if_all_corrupt,
        stop_timeout_s=values.stop_timeout_s,
        saved_model_path=values.saved_model_path,
        inference_batch_sizes=parse_dims(nvidia_flags.inference_batch_sizes_of(values), "inference_batch_sizes"),
        # Early stopping ends with the best state: it keeps it as --keep_best does.
        keep_best=values.keep_best or values.early_stopping_patience > 0,
        test_split=values.test_split,
        select_on_test=values.select_on_test,
        calibration=values.calibration,
        horovod_cycle_time_ms=parse_cycle_time(values.horovod_cycle_time_ms),
    )


def loop_from_flags(values: flags.FlagValues) -> LoopConfig:
    """The loop's settings; ``--eval_every_steps`` replaces ``--evals_per_epoch`` (both given: refused)."""
    if values.eval_every_steps and values["evals_per_epoch"].present:
        raise ValueError(f"Expected one of --evals_per_epoch and --eval_every_steps. Received: "
                         f"--evals_per_epoch={values.evals_per_epoch} --eval_every_steps={values.eval_every_steps}")
    return LoopConfig(
        epochs=values.epochs,
        max_steps=values.max_steps,
        evals_per_epoch=0 if values.eval_every_steps else values.evals_per_epoch,
        auc_threshold=values.auc_threshold,
        print_freq=values.print_freq,
        eval_every_steps=values.eval_every_steps,
        eval_max_batches=values.eval_max_batches,
        early_stopping_patience=values.early_stopping_patience,
        early_stopping_min_delta=values.early_stopping_min_delta,
        early_stopping_metric=values.early_stopping_metric,
    )


def _plain_flags(values: flags.FlagValues) -> dict:
    """Every flag's value as JSON data: what a DLLogger log records first (``PARAMETER``), as NVIDIA's."""
    plain = {}
    for name, value in values.flag_values_dict().items():
        plain[name] = value if value is None or isinstance(value, (bool, int, float, str)) else str(value)
    return plain
