"""The benchmarks' plotting library, an optional dependency (the `eval` extra)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from hyfunc.errors import require_extra


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend: benchmarks run without a screen."""
    matplotlib = require_extra("matplotlib", "eval", "the benchmark reports (plots)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bars_per_source(path: Path, values: Mapping[str, float], ylabel: str, title: str,
                    target: float | None = None, color: str = "#4a7") -> None:
    """One bar per data source, on a 0-1 scale, with an optional dashed target line."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.bar(list(values), list(values.values()), color=color)
    if target is not None:
        ax.axhline(target, color="#a44", linestyle="--", linewidth=1, label=f"target {target:.0%}")
        ax.legend(loc="lower right")
    ax.set_ylim(0, 1)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.tick_params(axis="x", rotation=30, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def grouped_bars(path: Path, series: Mapping[str, Mapping[str, float]], ylabel: str, title: str,
                 target: float | None = None) -> None:
    """A bar per series (e.g. a method) in each group (e.g. a suite), on a 0-1 scale, with an
    optional dashed target line. `series`: name -> group -> value, every series with the same groups."""
    plt = pyplot()
    groups = list(next(iter(series.values())))
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(groups))], [values[g] for g in groups], width, label=name)
    if target is not None:
        ax.axhline(target, color="#a44", linestyle="--", linewidth=1)
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(groups))], groups)
    ax.set_ylim(0, 1)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
