"""Final answers after tool results (`hyfunc eval answers`): the facts check, the held-out
conversations, and the report, with a tiny random model writing the replies."""
import json

from hyfunc.cascade.agent_steps import ANSWER
from hyfunc.cascade.data import load_examples, split_examples
from hyfunc.cli import main
from hyfunc.eval.final_answers import answer_facts, fact_told, held_out_answer_steps, summarize, write_report
from hyfunc.formats.messages import content_text
from hyfunc.data import FC_TRAIN
from tests.tiny_models import tiny_backend


def test_a_fact_is_told_verbatim_or_as_the_same_number():
    assert fact_told("K12345", "Your booking code is k12345.")
    assert fact_told("1234.0", "The total is 1,234 dollars.")
    assert fact_told("3.5", "It measures 3.5 m.")
    assert not fact_told("3.5", "It measures 35 m.")
    assert not fact_told("confirmed", "It is pending.")


def test_held_out_conversations_end_in_results_that_state_their_facts():
    steps = held_out_answer_steps([str(FC_TRAIN)], per_source=3)
    _, validation = split_examples(load_examples([str(FC_TRAIN)]))
    held_out = {e.id for e in validation}
    assert steps and all(step.label == ANSWER and step.facts for step in steps)
    assert all(set(step.id.split("+")) <= held_out for step in steps)  # joined requests: both held out
    for step in steps:
        results = " ".join(content_text(m["content"]) for m in step.messages if m["role"] == "tool")
        assert all(fact in results for fact in step.facts)


def test_report_from_a_tiny_model(tmp_path):
    steps = held_out_answer_steps([str(FC_TRAIN)], per_source=1)[:3]
    records = answer_facts(tiny_backend(32, seed=0), steps, max_tokens=8, progress=False)
    assert [r["id"] for r in records] == [s.id for s in steps]
    for record in records:
        assert set(record["told"]) <= set(record["facts"]) and record["output_tokens"] <= 8
    figures = write_report(tmp_path, records, {"model": "tiny", "engine": "transformers", "max_tokens": 8}, ["hyfunc", "eval", "answers"])
    assert figures["all"]["n"] == 3 and figures == summarize(records)
    saved = json.loads((tmp_path / "final_answers.json").read_text())
    assert saved["command"] == "hyfunc eval answers" and saved["figures"]["all"]["n"] == 3
    assert len((tmp_path / "replies.jsonl").read_text().splitlines()) == 3
    assert (tmp_path / "final_answers.png").stat().st_size > 0 and "| all | 3 |" in (tmp_path / "README.md").read_text()


def test_cli_refuses_data_without_calls(tmp_path, capsys):
    data = tmp_path / "none.jsonl"
    data.write_text(json.dumps({"id": "x", "source": "s", "query": "hi", "tools": [], "answers": []}) + "\n")
    assert main(["eval", "answers", "--data", str(data), "--out", str(tmp_path / "out")]) != 0
    assert "no conversation with calls" in capsys.readouterr().err
