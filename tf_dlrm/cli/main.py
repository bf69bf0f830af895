"""``main.py``: train, evaluate, benchmark inference or export DLRM; ``horovodrun -np N`` for N ranks."""

from __future__ import annotations

if __name__ == "__main__":  # before the imports below (TensorFlow): a stop signal while they run counts
    from tf_dlrm.io.early_stop import stop_rank_while_starting

    stop_rank_while_starting()

import os
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags

from tf_dlrm.cli.flag_reference import HELP_ARGUMENTS, help_text
from tf_dlrm.cli.flags import config_from_flags, define_flags, refuse_repeated_flags
from tf_dlrm.cli.nvidia_scripts import user_argv
from tf_dlrm.train.interrupt import exit_now

try:
    define_flags(sys.argv)
except ValueError as error:  # --model names a model that cannot be loaded (its flags are defined here)
    print(f"error (rank {os.environ.get('HOROVOD_RANK', '0')}): {error}", file=sys.stderr, flush=True)
    sys.exit(2)
FLAGS = flags.FLAGS


def main(argv):
    del argv
    from tf_dlrm.train.interrupt import Interrupted, SignalStop

    stop = SignalStop().install()
    try:
        refuse_repeated_flags(user_argv(sys.argv), FLAGS)
        config = config_from_flags(FLAGS)
        from tf_dlrm.cli import modes, preflight

        preflight.check_checkpoints_outlive_the_process(config)
        stop.stuck_after_s = config.stop_timeout_s

        modes.run(config, stop)
    except Interrupted as interrupted:  # before the first step (or outside training): nothing to save
        if os.environ.get("HOROVOD_RANK", "0") == "0":
            when = "before training started" if FLAGS.mode == "train" else f"(--mode={FLAGS.mode})"
            print(f"interrupted {when}; nothing was saved", file=sys.stderr, flush=True)
        exit_now(interrupted.exit_code)
    except (ValueError, OSError) as error:
        _fail(str(error))
    except Exception as error:  # noqa: BLE001: a data error raised inside tf.data comes wrapped in a TF error
        from tf_dlrm.data.validation import message_of
        from tf_dlrm.train.interrupt import lost_rank_message

        message = message_of(error)
        if message is not None:
            _fail(message)
        lost = lost_rank_message(error)
        if lost is None:
            traceback.print_exc()
            exit_now(1)
        _fail(lost, code=1)  # not 2: nothing wrong with the input or flags, a restart may succeed


def _fail(message: str, code: int = 2) -> None:
    rank = os.environ.get("HOROVOD_RANK", "0")
    print(f"error (rank {rank}): {message}", file=sys.stderr, flush=True)
    exit_now(code)


def run():
    # absl's --help lists only the main module's own flags (none: they are defined in tf_dlrm.cli);
    # this lists them all, by topic.
    if any(argument in HELP_ARGUMENTS for argument in sys.argv[1:]):
        sys.stdout.write(help_text(FLAGS, sys.modules["__main__"].__doc__ or ""))
        sys.exit(0)
    app.run(main)


if __name__ == "__main__":
    run()
