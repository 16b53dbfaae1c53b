"""Out-of-distribution validation: whole data sources a cascade never trained on (fc-train sources
left out of `hyfunc prepare --data`, and AgentDojo's tasks, in no training data), written as a data
set in BFCL's layout and scored by bfcl-eval's own checker, every case tagged with the kinds of
values it asks for.

Rules, thresholds and training options are chosen here, not on BFCL (the test set). A cascade is
out of distribution on the fc-train sources only when `hyfunc prepare --data` left them out; the
builder refuses nothing about that, the command names a cascade whose manifest lists one of them.

The conversion follows BFCL's conventions, so `hyfunc.eval.bfcl` loads and checks the cases
unchanged:
- categories by shape: no call -> irrelevance, one call -> simple_python (one tool offered) or
  multiple, several calls -> parallel (one tool) or parallel_multiple;
- function docs keep the schema the data gives, with BFCL's type names (object -> dict,
  number -> float), since its checker looks types up by those names;
- possible answers: each argument of the gold call -> [value] ("" too where the value is the
  schema's default); each optional parameter the gold call leaves out -> ["", default]; a nested
  object -> [{key: [value]}], a list of objects -> [[{key: [value]}, ...]], as BFCL writes them.
No-call cases are made as the training data's refusal examples are (`augment_refusals`): a request
shown its own tools without the called ones, or only another request's tools.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from hyfunc.cascade.data import augment_refusals, jsonl_files, load_examples, sample_by_pattern
from hyfunc.errors import InputError
from hyfunc.formats.schema import parse_tool

#: Sources held out by default: two fc-train sources unlike the rest in origin (Seal-Tools: LLM-written
#: tools of a 4,076-tool library; ToolAlpaca: real-world API docs), and AgentDojo's suites, in no
#: training data (hyfunc/data/ood/README.md).
HELD_OUT_SOURCES = ("sealtools", "hammer_toolalpaca", "agentdojo")

#: Kinds of value a case asks for (a case has several); "similar_apis": an offered, uncalled tool
#: whose name shares a content word with a called tool's name.
KINDS = ("bool", "enum", "list", "number", "nested_object", "free_string", "parallel", "similar_apis", "irrelevance")

# Verbs and fillers that most tool names share; two names that share only these are not similar.
_GENERIC_NAME_WORDS = frozenset(
    "get set list search find create update delete add remove fetch retrieve check query make "
    "api info data details by for of the a to and from all new".split()
)


@dataclass
class OodCase:
    id: str
    source: str
    category: str
    query: str
    functions: list[dict]  # BFCL function docs
    ground_truth: list[dict]  # BFCL possible answer; [] for irrelevance
    kinds: list[str]


def bfcl_doc(tool: Mapping[str, Any]) -> dict:
    """A JSON Schema tool as a BFCL function doc: BFCL's type names, which its checker looks up."""
    return parse_tool(tool).to_bfcl()


def _accepted(value: Any) -> Any:
    """One gold value as BFCL's possible-answer entry for it (the list of accepted values)."""
    if isinstance(value, dict):
        return [{k: _accepted(v) for k, v in value.items()}]
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [[{k: _accepted(v) for k, v in item.items()} for item in value]]
    return [value]


def possible_answer(call: Mapping[str, Any], tool: Mapping[str, Any]) -> dict:
    """BFCL's ground-truth entry for one gold call ({name: {param: [accepted values]}})."""
    params = (tool.get("parameters") or {}).get("properties", {})
    args: dict[str, list] = {}
    for name, value in call.get("arguments", {}).items():
        accepted = _accepted(value)
        if "default" in params.get(name, {}) and params[name]["default"] == value:
            accepted.append("")
        args[name] = accepted
    for name, schema in params.items():
        if name not in args:
            args[name] = ["", schema["default"]] if "default" in schema else [""]
    return {call["name"]: args}


def _name_words(name: str) -> set[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    words = {w for w in re.split(r"[^A-Za-z]+", spaced.lower()) if len(w) > 2 and w not in _GENERIC_NAME_WORDS}
    return {w[:-1] if len(w) > 3 and w.endswith("s") else w for w in words}  # "alarms" is "alarm"


def value_kinds(value: Any, schema: Mapping[str, Any]) -> set[str]:
    kind = schema.get("type")
    if "enum" in schema:
        return {"enum"}
    if kind == "boolean" or isinstance(value, bool):
        return {"bool"}
    if kind in ("integer", "number"):
        return {"number"}
    if kind == "object" or isinstance(value, dict):
        return {"nested_object"}
    if kind == "array" or isinstance(value, list):
        items = schema.get("items") or {}
        nested = items.get("type") == "object" or any(isinstance(v, dict) for v in value or [])
        return {"list", "nested_object"} if nested else {"list"}
    return {"free_string"}


def case_kinds(tools: Sequence[Mapping[str, Any]], answers: Sequence[Mapping[str, Any]]) -> list[str]:
    if not answers:
        return ["irrelevance"]
    by_name = {t["name"]: t for t in tools}
    kinds: set[str] = {"parallel"} if len(answers) > 1 else set()
    for call in answers:
        params = (by_name[call["name"]].get("parameters") or {}).get("properties", {})
        for name, value in call.get("arguments", {}).items():
            kinds |= value_kinds(value, params.get(name, {}))
    called = {c["name"] for c in answers}
    called_words = set().union(*(_name_words(n) for n in called))
    if any(_name_words(t["name"]) & called_words for t in tools if t["name"] not in called):
        kinds.add("similar_apis")
    return [k for k in KINDS if k in kinds]


def category(tools: Sequence[Any], answers: Sequence[Any]) -> str:
    if not answers:
        return "irrelevance"
    if len(answers) == 1:
        return "simple_python" if len(tools) == 1 else "multiple"
    return "parallel" if len(tools) == 1 else "parallel_multiple"


def _raw_records(paths: Sequence[str | Path]) -> dict[str, dict]:
    """id -> the JSON record as the data file holds it (tools as written, not as parsed)."""
    records = {}
    for file in jsonl_files(paths):
        for line in file.read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                records[str(record["id"])] = record
    return records


def build_cases(data: Sequence[str | Path], sources: Sequence[str], per_source: int, seed: int = 0,
                refusal_fraction: float = 0.15) -> list[OodCase]:
    """`per_source` examples of each held-out source (seeded, balanced by call pattern), plus no-call
    cases made from them as the training data's refusal examples are."""
    examples = load_examples(data)
    found = {e.source for e in examples}
    missing = [s for s in sources if s not in found]
    if missing:
        raise InputError(f"no example of source {', '.join(missing)} in the data; sources there: {', '.join(sorted(found))}")
    raw = _raw_records(data)
    cases: list[OodCase] = []
    for source in sources:
        picked = [e for e in examples if e.source == source]
        picked = sample_by_pattern(picked, min(per_source, len(picked)), seed)
        for example in augment_refusals(picked, refusal_fraction, seed):
            record_id = example.id.split("~")[0]
            tools = [t for t in raw[record_id]["tools"] if t["name"] in {tool.name for tool in example.tools}]
            if "~tools-of~" in example.id:  # another example's tools
                other = raw[example.id.split("~tools-of~")[1]]["tools"]
                tools = [t for t in other if t["name"] in {tool.name for tool in example.tools}]
            answers = [{"name": c.name, "arguments": c.arguments} for c in example.answers]
            by_name = {t["name"]: t for t in tools}
            cases.append(OodCase(
                id=f"ood_{example.id}", source=source, category=category(tools, answers), query=example.query,
                functions=[bfcl_doc(t) for t in tools],
                ground_truth=[possible_answer(a, by_name[a["name"]]) for a in answers],
                kinds=case_kinds(tools, answers),
            ))
    return cases


def write_bfcl_layout(cases: Sequence[OodCase], folder: Path) -> dict[str, int]:
    """`OOD_<category>.json` question files, `possible_answer/` beside them and `kinds.json`;
    returns cases per category. Rewrites the folder's files, so a rerun with other options starts clean."""
    (folder / "possible_answer").mkdir(parents=True, exist_ok=True)
    for old in [*folder.glob("OOD_*.json"), *(folder / "possible_answer").glob("OOD_*.json")]:
        old.unlink()
    per_category: dict[str, list[OodCase]] = {}
    for case in cases:
        per_category.setdefault(case.category, []).append(case)
    for name, members in per_category.items():
        questions = [{"id": c.id, "question": [[{"role": "user", "content": c.query}]], "function": c.functions}
                     for c in members]
        _write_jsonl(folder / f"OOD_{name}.json", questions)
        if name != "irrelevance":
            _write_jsonl(folder / "possible_answer" / f"OOD_{name}.json",
                         [{"id": c.id, "ground_truth": c.ground_truth} for c in members])
    kinds = {c.id: {"source": c.source, "kinds": c.kinds} for c in cases}
    (folder / "kinds.json").write_text(json.dumps(kinds, indent=1) + "\n", encoding="utf-8")
    return {name: len(members) for name, members in per_category.items()}


def _write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")



# ---------------------------------------------------------------------------------------------
# The report per kind of value


def miss_family(record: Mapping[str, Any]) -> str:
    """Why a case was scored wrong, in a few words: the checker's error type where it gives one."""
    error = str(record.get("error") or "")
    if record.get("category") == "irrelevance":
        return "called a tool"
    if not record.get("calls"):
        return "no call" if not record.get("model_error") else "no valid call"
    match = re.match(r"\[([^\]]+)\]", error)
    return match.group(1) if match else error.split(".")[0][:60]


def _tally(records: Sequence[Mapping[str, Any]]) -> dict:
    correct = sum(1 for r in records if r.get("correct"))
    misses: dict[str, int] = {}
    for r in records:
        if not r.get("correct"):
            misses[miss_family(r)] = misses.get(miss_family(r), 0) + 1
    return {"n": len(records), "correct": correct, "accuracy": correct / len(records) if records else None,
            "misses": dict(sorted(misses.items(), key=lambda kv: -kv[1]))}


def kind_summary(records: Mapping[str, Sequence[Mapping[str, Any]]], kinds: Mapping[str, Mapping[str, Any]],
                 main: str, baseline: str | None) -> dict:
    """Per kind and per source, each method's tally; and the cases `main` got wrong that `baseline`
    got right, by kind and miss family (where the cascade loses to direct prompting, and why)."""
    scored = {label: [r for r in recs if r["id"] in kinds] for label, recs in records.items()}
    groups = {**{k: lambda r, k=k: k in kinds[r["id"]]["kinds"] for k in KINDS}, "overall": lambda r: True}
    sources = sorted({v["source"] for v in kinds.values()})
    summary: dict[str, Any] = {
        "methods": list(records), "main": main, "baseline": baseline,
        "kinds": {g: {label: _tally([r for r in recs if keep(r)]) for label, recs in scored.items()}
                  for g, keep in groups.items()},
        "sources": {s: {label: _tally([r for r in recs if kinds[r["id"]]["source"] == s]) for label, recs in scored.items()}
                    for s in sources},
    }
    # Paired against the main method: the cases only it got right, and only the other one did (an
    # ablation's verdict is these two counts, not the difference of two accuracies).
    main_right = {r["id"] for r in scored[main] if r.get("correct")}
    summary["against_main"] = {
        label: {"only_main_right": len(main_right - {r["id"] for r in recs if r.get("correct")}),
                "only_this_right": len({r["id"] for r in recs if r.get("correct")} - main_right)}
        for label, recs in scored.items() if label != main
    }
    if baseline is not None:
        right = {r["id"] for r in scored[baseline] if r.get("correct")}
        lost = [r for r in scored[main] if not r.get("correct") and r["id"] in right]
        gained = [r for r in scored[main] if r.get("correct") and r["id"] not in right]
        summary["lost_to_baseline"] = {k: _tally([r for r in lost if k in kinds[r["id"]]["kinds"]])["misses"] for k in KINDS}
        summary["lost_ids"] = [r["id"] for r in lost]
        summary["gained_ids"] = [r["id"] for r in gained]
        summary["kinds_at_least_baseline"] = [
            k for k in KINDS if summary["kinds"][k][main]["n"]
            and summary["kinds"][k][main]["accuracy"] >= summary["kinds"][k][baseline]["accuracy"]
        ]
    return summary


def first_calls_right(records: Mapping[str, Sequence[Mapping[str, Any]]], folder: Path) -> dict[str, dict]:
    """Per method, of the cases with one gold call: those whose first written call alone passes the
    checker. A multi-step task's first step may be right while the method goes on with calls that
    need its result (BFCL's checker then counts the whole answer wrong)."""
    from hyfunc.eval.bfcl import check, load_cases

    single = {case.id: case for path in sorted(folder.glob("OOD_*.json")) if path.stem[4:] in ("simple_python", "multiple")
              for case in load_cases(path.stem[4:], folder)}
    out = {}
    for label, recs in records.items():
        scored = [r for r in recs if r["id"] in single]
        right = [r["id"] for r in scored if r.get("calls") and check(single[r["id"]], r["calls"][:1])[0]]
        out[label] = {"n": len(scored), "correct": len(right), "ids": right}
    return out


def _cell(tally: Mapping[str, Any]) -> str:
    return "–" if not tally["n"] else f"{100 * tally['accuracy']:.1f} ({tally['correct']}/{tally['n']})"


def kind_markdown(summary: Mapping[str, Any]) -> str:
    methods = summary["methods"]
    lines = ["| kind | " + " | ".join(f"{m} % (right/n)" for m in methods) + " |",
             "|---|" + "|".join("---:" for _ in methods) + "|"]
    for group in [*KINDS, "overall"]:
        name = f"**{group}**" if group == "overall" else group
        lines.append(f"| {name} | " + " | ".join(_cell(summary["kinds"][group][m]) for m in methods) + " |")
    lines += ["", "| source | " + " | ".join(methods) + " |", "|---|" + "|".join("---:" for _ in methods) + "|"]
    for source, row in summary["sources"].items():
        lines.append(f"| {source} | " + " | ".join(_cell(row[m]) for m in methods) + " |")
    if summary.get("first_call"):
        lines += ["", "First call right (cases with one gold call; later calls not scored): " + "; ".join(
            f"{label} {t['correct']}/{t['n']}" for label, t in summary["first_call"].items()) + "."]
    if summary.get("against_main"):
        lines += ["", f"| paired with {summary['main']} | only {summary['main']} right | only this one right |",
                  "|---|---:|---:|"]
        lines += [f"| {label} | {pair['only_main_right']} | {pair['only_this_right']} |"
                  for label, pair in summary["against_main"].items()]
    if summary.get("baseline"):
        main, base = summary["main"], summary["baseline"]
        lines += ["", f"Cases {main} got wrong and {base} right: {len(summary['lost_ids'])}; the reverse: "
                  f"{len(summary['gained_ids'])}. Kinds where {main} is at least level: "
                  f"{', '.join(summary['kinds_at_least_baseline']) or 'none'}."]
        lost = {kind: families for kind, families in summary["lost_to_baseline"].items() if families}
        if lost:
            lines += ["", f"| kind | {main}'s misses where {base} was right (checker's error type: count) |", "|---|---|"]
            lines += [f"| {kind} | " + "; ".join(f"{f}: {n}" for f, n in families.items()) + " |"
                      for kind, families in lost.items()]
    return "\n".join(lines)


def kind_plot(summary: Mapping[str, Any], path: Path) -> None:
    from hyfunc.eval.plots import pyplot

    plt = pyplot()
    groups = [k for k in [*KINDS, "overall"] if any(summary["kinds"][k][m]["n"] for m in summary["methods"])]
    width = 0.8 / len(summary["methods"])
    fig, ax = plt.subplots(figsize=(9, 3.4))
    for i, method in enumerate(summary["methods"]):
        values = [summary["kinds"][g][method]["accuracy"] or 0 for g in groups]
        ax.bar([x + i * width for x in range(len(groups))], values, width, label=method)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(groups))], groups, rotation=30, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("right (BFCL checker)")
    ax.set_title("out-of-distribution set, per kind of value")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
