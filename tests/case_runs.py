"""The frame shared by the equivalence workers: every case of a JSON file run on this rank, one
record per case, written to ``OUT_DIR/rank<r>.json`` (``python WORKER CASES_JSON OUT_DIR`` under
horovodrun; :func:`conftest.launch_cases` is the test side)."""

from __future__ import annotations

import json
import os
import sys


def run_cases_on_this_rank(run_case, inter_op_threads: int = 1) -> None:
    """``run_case(case, env) -> dict`` for every case, on one intra-op thread (oversubscribed ranks)."""
    import tensorflow as tf

    from tf_dlrm.parallel import env as env_module

    cases_path, out_dir = sys.argv[1], sys.argv[2]
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)
    env = env_module.initialize(force_horovod=True)
    with open(cases_path) as handle:
        cases = json.load(handle)
    records = [run_case(case, env) for case in cases]
    with open(os.path.join(out_dir, f"rank{env.rank}.json"), "w") as handle:
        json.dump(records, handle, indent=1)
