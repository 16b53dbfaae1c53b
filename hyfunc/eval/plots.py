"""The benchmarks' plotting library, an optional dependency (the `eval` extra)."""
from __future__ import annotations

from typing import Any

from hyfunc.errors import require_extra


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend: benchmarks run without a screen."""
    matplotlib = require_extra("matplotlib", "eval", "the benchmark reports (plots)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
