"""Split an `hyfunc eval ood` run into cases whose gold string values the request states and cases it
does not (Seal-Tools and ToolAlpaca golds hold API keys and values no request gives), and count each
method's right answers on both, paired with the main method.

    python scripts/ood_answerable.py reports/ood/held-out "hyfunc@transformers"

A string heuristic: a gold parameter counts as stated when one of its accepted strings, lower-cased
with punctuation folded to spaces, is a substring of the request; numbers and empty (optional)
answers are not checked.
"""
import json
import re
import sys
from pathlib import Path


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def stated(request: str, ground_truth: list[dict]) -> bool:
    words = _norm(request)
    for call in ground_truth:
        for arguments in call.values():
            for accepted in arguments.values():
                strings = [a for a in accepted if isinstance(a, str) and a != ""]
                if strings and not any(_norm(s) in words for s in strings):
                    return False
    return True


def main(run: Path, main_label: str) -> None:
    requests, gold = {}, {}
    for path in (run / "data").glob("OOD_*.json"):
        for line in path.open(encoding="utf-8"):
            case = json.loads(line)
            requests[case["id"]] = " ".join(m["content"] for turn in case["question"] for m in turn)
    for path in (run / "data" / "possible_answer").glob("*.json"):
        for line in path.open(encoding="utf-8"):
            case = json.loads(line)
            gold[case["id"]] = case["ground_truth"]
    runs = {p.parent.name: {json.loads(l)["id"]: json.loads(l)["correct"] for l in p.open(encoding="utf-8")}
            for p in sorted(run.glob("*/cases.jsonl"))}
    main_run = runs[main_label.replace(":", "_").replace("/", "_")]
    ids = [i for i in main_run if all(i in r for r in runs.values())]
    answerable = [i for i in ids if stated(requests[i], gold.get(i, []))]
    print(f"{len(ids)} cases scored by every method, {len(answerable)} with every gold string stated in the request")
    print("| method | right (all) | right (stated) | only the main method right | only this one right |")
    print("|---|---:|---:|---:|---:|")
    for label, right in runs.items():
        only_main = sum(main_run[i] and not right[i] for i in ids)
        only_this = sum(right[i] and not main_run[i] for i in ids)
        print(f"| {label} | {sum(right[i] for i in ids)}/{len(ids)} | {sum(right[i] for i in answerable)}/{len(answerable)} "
              f"| {only_main} | {only_this} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
