"""Convert AgentDojo's user tasks (PyPI `agentdojo`, MIT) into fc-train's record format, as a second
out-of-distribution source for `hyfunc eval ood` (hyfunc/data/ood/README.md says what and why).

Each user task becomes one request: its prompt, every tool of its suite (the pydantic argument
models' JSON Schemas, made plain: `$ref`s inlined, `Optional[X]` as X, titles dropped) and the first
call of its ground truth (later calls depend on earlier calls' results, which a single step cannot
know). A task is kept only when its prompt states every value of that call (strings and list items
word for word, ignoring case; numbers as written), fc-train's rule for dialogues.

    pip install --no-deps --target /tmp/agentdojo agentdojo==0.1.35 && \
      pip install --target /tmp/agentdojo deepdiff docstring-parser email-validator
    PYTHONPATH=/tmp/agentdojo python scripts/agentdojo_to_jsonl.py --out hyfunc/data/ood/agentdojo.jsonl
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

SUITES = ("banking", "slack", "travel", "workspace")
_DROPPED_KEYS = {"title", "$defs"}


def plain_schema(schema: dict, defs: dict) -> dict:
    if "$ref" in schema:
        return plain_schema(defs[schema["$ref"].split("/")[-1]], defs)
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s.get("type") != "null"]
        merged = {**plain_schema(options[0], defs), **{k: v for k, v in schema.items() if k not in ("anyOf", "default")}}
        if schema.get("default") is not None:
            merged["default"] = schema["default"]
        return plain_schema(merged, defs)
    out = {k: v for k, v in schema.items() if k not in _DROPPED_KEYS and not (k == "default" and v is None)}
    if "properties" in out:
        out["properties"] = {k: plain_schema(v, defs) for k, v in out["properties"].items()}
    if isinstance(out.get("items"), dict):
        out["items"] = plain_schema(out["items"], defs)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def tool_record(function) -> dict:
    schema = function.parameters.model_json_schema()
    parameters = plain_schema(schema, schema.get("$defs", {}))
    parameters.setdefault("properties", {})
    parameters["required"] = list(schema.get("required", []))
    return {"name": function.name, "description": function.description.strip(), "parameters": parameters}


def stated(value, prompt: str) -> bool:
    """Whether the prompt gives `value` (fc-train's rule: a value the request does not hold drops it)."""
    text = prompt.lower()
    if isinstance(value, bool) or value is None:
        return True  # a flag is asked for in words, not written
    if isinstance(value, (int, float)):
        return any(form in text for form in {str(value), f"{value:g}", f"{value:,}"})
    if isinstance(value, str):
        return value.lower() in text
    if isinstance(value, list):
        return all(stated(v, prompt) for v in value)
    if isinstance(value, dict):
        return all(stated(v, prompt) for v in value.values())
    return False


def main() -> None:
    from agentdojo.task_suite.load_suites import get_suite

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="v1", help="AgentDojo benchmark version")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    records, dropped = [], Counter()
    for name in SUITES:
        suite = get_suite(args.version, name)
        tools = [tool_record(f) for f in suite.tools]
        environment = suite.load_and_inject_default_environment({})
        for task_id, task in suite.user_tasks.items():
            calls = task.ground_truth(environment.model_copy(deep=True))
            if not calls:
                dropped["no ground-truth call"] += 1
                continue
            first = calls[0]
            arguments = {k: v for k, v in dict(first.args).items() if v is not None}
            prompt = " ".join(task.PROMPT.split())
            if not all(stated(v, prompt) for v in arguments.values()):
                dropped["a value the prompt does not state"] += 1
                continue
            records.append({"id": f"agentdojo-{name}-{task_id}", "source": "agentdojo", "query": prompt,
                            "tools": tools, "answers": [{"name": first.function, "arguments": arguments}]})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    print(f"{len(records)} tasks kept; dropped: {dict(dropped)}")


if __name__ == "__main__":
    main()
