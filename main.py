"""Train DLRM: ``python main.py --dataset_path=DIR ...`` or ``horovodrun -np N python main.py ...``.

All flags are described by ``python main.py --helpfull``; see README.md.
"""

from tf_dlrm.cli.main import run

if __name__ == "__main__":
    run()
