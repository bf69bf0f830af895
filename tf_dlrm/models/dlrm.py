"""DLRM, the default model of the family (defined in :mod:`tf_dlrm.model.dlrm`, re-exported here)."""

from tf_dlrm.model.dlrm import DLRM

__all__ = ["DLRM"]
