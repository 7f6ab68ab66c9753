"""kubectl's JSONPath as `kubectl vigil -o jsonpath=` prints it (vigil.plugin.jsonpath): the
templates kubectl users type, what kubectl prints for them, properties over any document, and a
clear refusal of what the subset does not take."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vigil.plugin.jsonpath import JsonPathError, execute, parse

pytestmark = pytest.mark.unit

JOBS = {
    "items": [
        {
            "metadata": {"name": "poison", "namespace": "ns", "annotations": {"vigil.dev/redrive": "1700000000"}},
            "attempts": 3,
            "conditions": [{"type": "Succeeded", "status": "False"}, {"type": "DeadLettered", "status": "True"}],
        },
        {"metadata": {"name": "flaky", "namespace": "ns"}, "attempts": 1, "conditions": []},
    ]
}


@pytest.mark.parametrize(
    ("template", "printed"),
    [
        ("{.items[*].metadata.name}", "poison flaky"),
        ('{range .items[*]}{.metadata.name}{"\\n"}{end}', "poison\nflaky\n"),
        ('{range .items[*]}{.metadata.name}{"\\t"}{.attempts}{"\\n"}{end}', "poison\t3\nflaky\t1\n"),
        ("{.items[0].metadata.annotations.vigil\\.dev/redrive}", "1700000000"),
        ("{.items[0].metadata.annotations['vigil.dev/redrive']}", "1700000000"),
        ('{.items[0].conditions[?(@.type=="DeadLettered")].status}', "True"),
        ("{.items[?(@.attempts>1)].metadata.name}", "poison"),
        ('{.items[?(@.metadata.name!="poison")].attempts}', "1"),
        ("{.items[?(@.metadata.annotations)].metadata.name}", "poison"),
        ("{.items[-1].metadata.name}", "flaky"),
        ("{.items[0:1].metadata.name}", "poison"),
        ("{..namespace}", "ns ns"),
        ("{.items[1].conditions}", "[]"),
        ("{.items[1].metadata}", '{"name":"flaky","namespace":"ns"}'),
        ("names: {$.items[*].metadata.name}!", "names: poison flaky!"),
        ("{.items[*].missing}", ""),  # kubectl's default --allow-missing-template-keys=true
        ("{.items[5].metadata.name}", ""),
        ("no braces at all", "no braces at all"),
        ('{.items[0].attempts}{"\t"}', "3\t"),  # a tab typed as itself (ctrl-v tab), kept
        ("{range .items[*]}[{range .conditions[*]}{.type},{end}]{end}", "[Succeeded,DeadLettered,][]"),
    ],
)
def test_the_templates_kubectl_users_type_print_as_kubectl_prints_them(template, printed):
    assert execute(template, JOBS) == printed


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("{.items[*].metadata.name", "unclosed action"),
        ("{.items[*}", "unclosed array"),
        ("{range .items[*]}{.metadata.name}", "a {range} without its {end}"),
        ("{.a}{end}", "{end} without a {range}"),
        ("{items}", "unrecognized identifier items"),
        ("{.items['a','b']}", "['a','b'] is not supported by kubectl vigil; supported: fields"),
        ("{.a .b}", "one path an action"),
        ("{}", "an empty action"),
        ("{.items[?(@.a==x)]}", "compare with a quoted string or a number"),
        ("{.items[?(@.a=~x)]}", "the filter ?(@.a=~x) is not supported by kubectl vigil"),
        ('{"unclosed}', "unclosed action"),
    ],
)
def test_what_it_does_not_read_is_refused_naming_it(template, says):
    with pytest.raises(JsonPathError, match="error parsing jsonpath") as refused:
        parse(template)
    assert says in str(refused.value)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=20,
)
KEYS = st.text(st.characters(categories=["L", "N"]), min_size=1, max_size=6)


@given(JSON)
def test_the_whole_document_is_its_compact_json_and_text_without_braces_is_itself(document):
    printed = execute("{.}", document)
    expected = "" if document is None else printed
    assert printed == expected
    if isinstance(document, (dict, list)):
        assert json.loads(printed) == document
    assert execute("plain text, no action", document) == "plain text, no action"


@given(st.dictionaries(KEYS, st.text(st.characters(categories=["L"]), max_size=5), min_size=1))
def test_a_field_prints_its_value_and_a_bracketed_name_is_the_same_field(document):
    for key, value in document.items():
        assert execute("{." + key + "}", document) == value
        assert execute("{['" + key + "']}", document) == value


@given(st.lists(st.dictionaries(KEYS, st.integers(0, 99), max_size=3), max_size=6), KEYS)
def test_range_is_the_body_once_per_item_and_star_is_every_item_joined_by_a_space(items, key):
    document = {"items": items}
    ranged = execute("{range .items[*]}<{." + key + '}>{"\\n"}{end}', document)
    assert ranged == "".join(f"<{item.get(key, '')}>\n" for item in items)
    assert execute("{.items[*]." + key + "}", document) == " ".join(str(i[key]) for i in items if key in i)


@given(st.lists(st.integers(), max_size=8), st.integers(-10, 10), st.integers(-10, 10))
def test_indices_and_slices_are_pythons_on_the_list(values, start, end):
    document = {"v": values}
    assert execute(f"{{.v[{start}:{end}]}}", document) == " ".join(str(v) for v in values[start:end])
    in_range = -len(values) <= start < len(values)
    assert execute(f"{{.v[{start}]}}", document) == (str(values[start]) if in_range else "")


@given(st.text(max_size=30))
def test_any_template_is_printed_or_refused_with_a_jsonpath_error_never_a_crash(template):
    try:
        execute(template, JOBS)
    except JsonPathError as err:
        assert str(err).startswith("error parsing jsonpath")
