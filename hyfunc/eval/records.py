"""Per-case records of a BFCL run (`cases.jsonl`): written by the runner, read by the reports."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hyfunc.durable import write_durably


def done_ids(path: Path) -> set[str]:
    """Ids already scored in cases.jsonl; a line cut by an interruption is dropped (redone)."""
    if not path.exists():
        return set()
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    done: set[str] = set()
    good: list[str] = []
    for line in lines:
        try:
            rec = json.loads(line)
            done.add(rec["id"])
            good.append(line if line.endswith("\n") else line + "\n")
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    if good != lines:
        write_durably(path, "".join(good))
    return done


def read_case_records(out_dir: str | Path) -> list[dict]:
    path = Path(out_dir) / "cases.jsonl"
    records = []
    if path.exists():
        for line in open(path, encoding="utf-8"):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=repr))
