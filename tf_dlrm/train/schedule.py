"""NVIDIA's DLRM learning-rate schedule: linear warmup, constant, then polynomial decay of power 2.

The schedule is a plain config (flags parse into it without TensorFlow): it lives in
:mod:`tf_dlrm.config.training`, where its formula is written out, and stays importable from here.
"""

from __future__ import annotations

from tf_dlrm.config.training import LearningRateSchedule  # noqa: F401
