"""NVIDIA DeepLearningExamples' ``dcnv2.py`` command line (TF2 DLRM_and_DCNv2): ``main.py`` with that script's defaults.

    python -u dcnv2.py --dataset_path DIR --amp --xla --save_checkpoint_path CKPT     (or horovodrun -np N ...)

Flags given on the line override the defaults (tf_dlrm/cli/nvidia_scripts.py; docs/training.md).
"""

if __name__ == "__main__":  # before the imports below (TensorFlow): a stop signal while they run counts
    from tf_dlrm.io.early_stop import stop_rank_while_starting

    stop_rank_while_starting("dcnv2.py")

import sys

from tf_dlrm.cli.nvidia_scripts import script_argv

sys.argv = script_argv("dcnv2.py", sys.argv)

from tf_dlrm.cli.main import run  # noqa: E402  (defines the flags of the line above)

if __name__ == "__main__":
    run()
