"""Log fields as JSON data (tf_dlrm's JSON-lines log and the DLLogger log write the same values)."""

from __future__ import annotations

import math
from typing import Any


def json_value(value: Any) -> Any:
    """numpy scalars as Python numbers; NaN and inf as null (JSON has neither)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
