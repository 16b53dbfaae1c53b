"""Schema augmentation (hyfunc.cascade.schema_variants): each variant changes its one thing and its
answer still fits its tools."""
import random

import pytest

from hyfunc.cascade.data import Example, load_examples
from hyfunc.cascade.schema_variants import BATCH_NAME, NESTED_NAME, VARIANTS, schema_variants
from hyfunc.data import FC_TRAIN
from hyfunc.formats.calls import Call
from hyfunc.formats.schema import parse_tools
from hyfunc.formats.validate import argument_errors

TOOLS = parse_tools([
    {"name": "set_alarm", "description": "Set an alarm. Rings once.", "parameters": {"type": "object", "properties": {
        "alarm_time": {"type": "string", "description": "When. As HH:MM."},
        "tone": {"type": "string", "enum": ["beep", "chime"], "description": "The sound."},
        "repeatDaily": {"type": "boolean", "default": False},
    }, "required": ["alarm_time"]}},
    {"name": "get_weather", "description": "Weather.", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}},
])
ALARMS = Example("x1", "toy", "Alarms at 7:00 with a chime and at 8:00, daily", TOOLS, [
    Call("set_alarm", {"alarm_time": "7:00", "tone": "chime"}),
    Call("set_alarm", {"alarm_time": "8:00", "repeatDaily": True}),
])


def _spelling(tools):
    """A schema as written, parameter order included (dicts compare without it)."""
    return [(t.name, t.description, list(t.parameters.items()), t.required) for t in tools]


@pytest.mark.parametrize("kind", sorted(VARIANTS))
def test_every_variant_changes_the_schema_and_keeps_the_answer_fitting(kind):
    variant = VARIANTS[kind](ALARMS, random.Random(0))
    assert variant is not None and _spelling(variant.tools) != _spelling(ALARMS.tools) and variant.query == ALARMS.query
    for call in variant.answers:
        assert argument_errors(call, variant.tools) == [], (kind, call)


def test_what_each_variant_writes():
    alarm = lambda example: next(t for t in example.tools if t.name.startswith("set_alarm"))  # noqa: E731
    renamed = VARIANTS["renamed"](ALARMS, random.Random(0))
    assert list(alarm(renamed).parameters) == ["alarmTime", "tone", "repeat_daily"]
    assert alarm(renamed).required == ["alarmTime"] and renamed.answers[1].arguments == {"alarmTime": "8:00", "repeat_daily": True}
    words = alarm(VARIANTS["enum-in-words"](ALARMS, random.Random(0))).parameters["tone"]
    assert words.enum is None and words.description == "The sound. One of: 'beep', 'chime'."
    assert alarm(VARIANTS["short-descriptions"](ALARMS, random.Random(0))).parameters["alarm_time"].description == "When."
    assert alarm(VARIANTS["long-descriptions"](ALARMS, random.Random(0))).parameters["repeatDaily"].description == "Boolean, optional."
    assert not alarm(VARIANTS["no-defaults"](ALARMS, random.Random(0))).parameters["repeatDaily"].has_default
    nested = VARIANTS["nested"](ALARMS, random.Random(0))
    assert list(alarm(nested).parameters) == [NESTED_NAME] and nested.answers[0].arguments == {
        NESTED_NAME: {"alarm_time": "7:00", "tone": "chime"}}
    batched = VARIANTS["batched"](ALARMS, random.Random(0))
    (call,) = batched.answers
    assert call.name == "set_alarm_batch" and call.arguments == {BATCH_NAME: [
        {"alarm_time": "7:00", "tone": "chime"}, {"alarm_time": "8:00", "repeatDaily": True}]}


def test_a_variant_that_does_not_apply_is_skipped():
    single = Example("x2", "toy", "Weather in Oslo", TOOLS[1:], [Call("get_weather", {"city": "Oslo"})])
    assert VARIANTS["batched"](single, random.Random(0)) is None
    assert VARIANTS["enum-in-words"](single, random.Random(0)) is None
    assert VARIANTS["renamed"](single, random.Random(0)) is None  # "city" has no other case


def test_schema_variants_on_fc_train_are_seeded_and_fit():
    examples = load_examples(FC_TRAIN)[::10]  # every source
    first, again = schema_variants(examples, 0.3, seed=1), schema_variants(examples, 0.3, seed=1)
    assert [v.id for v in first] == [v.id for v in again] and len(first) > 40
    assert {v.source for v in first} <= {f"augmented-{k}" for k in VARIANTS}
    assert len({v.source for v in first}) >= 5
    for variant in first:
        for call in variant.answers:
            assert argument_errors(call, variant.tools) == [], variant.id
