"""Data shipped inside the package: the default cascade and selector, the demo, and the training data.

`FC_TRAIN` (3,121 examples from seven public sources) and `TOOL_LIBRARY` (4,076 Seal-Tools tools) are
the project's training and validation data; their sources, conversion rules and licenses are in
fc-train/README.md and fc-train/LICENSES.md. They are the defaults of `hyfunc prepare --data` and the
benchmarks, and what the tests read.
"""
from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
FC_TRAIN = DATA_DIR / "fc-train"
TOOL_LIBRARY = DATA_DIR / "tool-library" / "sealtools.jsonl"
#: Out-of-distribution data in no training set (`hyfunc eval ood`; see ood/README.md).
OOD_DATA = DATA_DIR / "ood"
#: The hand-written tasks of `hyfunc bench agent` (see agent-tasks/README.md).
AGENT_TASKS = DATA_DIR / "agent-tasks" / "tasks.json"
