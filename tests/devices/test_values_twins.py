"""An item's fields as a reading's values, ``_mapping_py.values`` run as Python
(``mapping.values_py``) and compiled (``_mapping_c.values``), give the same answers.

Same values (types and key order included) and the same rejections (reason, detail,
index) for generated fields under rules that rename, keep, drop, map strings and keep,
drop or refuse them, or declare kinds ([rule.types]): names that collide once made
safe, reserved and overlong names, values of every kind (bools, ints at and beyond
int64, floats at and beyond the magnitude bound, NaN and infinities, strings at the byte
bound, arrays, objects, None).
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ingest.devices.decode import MAX_MAGNITUDE
from ingest.devices.mapping import Mapping, values_py
from ingest.devices.rules import parse
from tests.support.twins import compiled

twin = compiled("ingest.devices._mapping_c")

BASE = '[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\nmax_string_bytes = 8\n'
RULES = [
    BASE,
    BASE + 'strings = "reject"\n',
    BASE + 'strings = "drop"\nkeep = ["t*", "a*", "x y"]\ndrop = ["tz"]\n',
    BASE + 'drop = ["x*"]\n[rule.rename]\n"seq" = "r_seq"\n"a b" = "ab"\n'
    "[rule.values]\nON = true\nOFF = false\nlow = 0\n",
    BASE + '[rule.values]\nON = true\nOFF = "off"\nlow = 0\n'
    '[rule.types]\nnumber = ["t", "ab"]\nboolean = ["a*"]\nstring = ["x*"]\n',
    BASE + 'strings = "drop"\n[rule.types]\nnumber = ["*"]\n',
]

NAMES = st.one_of(
    st.sampled_from(
        [
            "t",
            "a",
            "a b",
            "a_b",
            "a-b",
            "ab",
            "seq",
            "ts",
            "_id",
            "x y",
            "x_y",
            "tz",
            "x1",
            "é",
            "",
            "a" * 64,
            "a" * 65,
            "ON",
            "info",
            "units",
        ]
    ),
    st.text(max_size=70),
)
VALUES: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 10**400]),
    st.floats(),
    st.sampled_from([MAX_MAGNITUDE, -MAX_MAGNITUDE, float("inf"), float("nan"), 1e301, -0.0]),
    st.sampled_from(["ON", "OFF", "low", "12345678", "123456789", "éééé", "ééééé", ""]),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)


@given(
    st.sampled_from(range(len(RULES))),
    st.dictionaries(NAMES, VALUES, max_size=8),
    st.one_of(st.none(), st.integers(0, 3)),
)
def test_values_agree(rule_at: int, fields: dict[str, Any], index: int | None) -> None:
    rules = parse(RULES[rule_at], "test")
    python, compiled_ = Mapping(rules), Mapping(rules)  # name caches apart
    rule = rules[0]
    for _ in range(2):  # names resolved, then from the cache
        expected_rejections: list[Any] = []
        got_rejections: list[Any] = []
        expected = values_py(python, rule, fields, expected_rejections, index)
        got = twin.values(compiled_, rule, fields, got_rejections, index)
        assert list(got.items()) == list(expected.items())
        assert [type(v) for v in got.values()] == [type(v) for v in expected.values()]
        assert got_rejections == expected_rejections


def test_a_dict_subclass_and_a_collision_give_the_python_answer() -> None:
    rules = parse(RULES[0], "test")
    rule = rules[0]

    class Fields(dict[str, object]):
        pass

    cases: list[dict[str, object]] = [
        {"a b": 1, "a_b": 2.5, "seq": 3, "n": float("nan"), "big": 2**64},
        Fields({"a b": True, "a_b": "x"}),
    ]
    for fields in cases:
        expected: list[Any] = []
        got: list[Any] = []
        assert twin.values(Mapping(rules), rule, fields, got, 1) == values_py(
            Mapping(rules), rule, fields, expected, 1
        )
        assert got == expected
        assert expected
