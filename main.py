"""Train DLRM: python main.py --dataset_path=DIR ... or horovodrun -np N python main.py ...

python main.py --help lists the flags by topic (docs/flags.md); README.md and docs/training.md show runs.
"""

if __name__ == "__main__":  # before the imports below (TensorFlow): a stop signal while they run counts
    from tf_dlrm.io.early_stop import stop_rank_while_starting

    stop_rank_while_starting("main.py")

from tf_dlrm.cli.main import run

if __name__ == "__main__":
    run()
