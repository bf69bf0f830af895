"""Train DLRM: python main.py --dataset_path=DIR ... or horovodrun -np N python main.py ...

python main.py --help lists the flags by topic (docs/flags.md); README.md and docs/training.md show runs.
"""

from tf_dlrm.cli.main import run

if __name__ == "__main__":
    run()
