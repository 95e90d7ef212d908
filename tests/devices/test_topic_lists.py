"""A rule that lists several topic filters (``topic = [...]``), through the mapping engine.

Each filter is tried in the rule's place, in the list's order; every filter of a rule
captures the same names; the daemon subscribes to each; ``ingest check`` names the rule
and the filter; the refusals are one line (docs/mapping.md, "Several topic filters in
one rule").
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import pytest

from ingest.devices.check import check
from ingest.devices.decode import Limits
from ingest.devices.mapping import Mapping
from ingest.devices.rules import parse
from ingest.errors import ConfigError

LIMITS = Limits()
WLED = """
[[rule]]
name = "wled-housekeeping"
topic = ["wled/+/api", "wled/+/col", "wled/+/status", "wled/all"]
ignore = true

[[rule]]
name = "wled"
topic = "wled/{sensor_id}/{measurement}"
format = "value"
"""


def mapping(text: str) -> Mapping:
    return Mapping(parse(text, "--mapping m.toml"))


def taken(m: Mapping, topic: str, payload: bytes = b"21.5") -> tuple[str | None, bool]:
    result = m.decode(topic, payload, time.time(), LIMITS)
    return (result.rule.name if result.rule is not None else None), result.ignored


def test_an_ignore_rule_takes_every_filter_it_lists_before_the_rules_after_it() -> None:
    m = mapping(WLED)
    for topic in ("wled/kitchen/api", "wled/porch/col", "wled/kitchen/status", "wled/all"):
        assert taken(m, topic, b"ON") == ("wled-housekeeping", True)
    assert taken(m, "wled/kitchen/c") == ("wled", False)
    assert taken(m, "wled/kitchen/g") == ("wled", False)
    # One rule, one name: the ignored counter's label is the rule's, whatever the filter.
    assert [r.name for r in m.rules if r.ignore] == ["wled-housekeeping"]
    # wled/+/+ (the readings' filter) covers three of the list's filters.
    assert m.subscriptions() == ("wled/all", "wled/+/+")


def test_the_rules_order_decides_between_rules_and_the_lists_order_within_one() -> None:
    """A rule before the list rule takes its topics first; a rule after it only what no
    filter of the list takes; within the list, the first filter that matches gives the
    captures."""
    m = mapping(
        '[[rule]]\nname = "first"\ntopic = "a/kitchen/g"\nformat = "value"\nsensor_id = "k"\n'
        'measurement = "gain"\n'
        '[[rule]]\nname = "listed"\ntopic = ["a/{sensor_id}/{measurement}", '
        '"b/{measurement}/{sensor_id}", "c/{sensor_id}/x/{measurement}"]\nformat = "value"\n'
        '[[rule]]\nname = "last"\ntopic = "#"\nignore = true\n'
    )
    assert taken(m, "a/kitchen/g") == ("first", False)
    got = m.decode("b/temp/s2", b"21.5", time.time(), LIMITS).decoded.readings
    assert [(r.sensor_id, r.values) for r in got] == [("s2", {"temp": 21.5})]
    got = m.decode("c/s3/x/hum", b"40", time.time(), LIMITS).decoded.readings
    assert [(r.sensor_id, r.values) for r in got] == [("s3", {"hum": 40})]
    assert taken(m, "c/s3/y/hum") == ("last", True)
    assert m.match("a/porch/g").captures == {"sensor_id": "porch", "measurement": "g"}  # type: ignore[union-attr]


def test_a_list_rule_with_match_falls_through_to_the_next_rule_for_its_filters() -> None:
    """``[rule.match]`` on a list rule: a payload it does not select goes to the next rule
    whose filter matches, from whichever filter of the list matched."""
    m = mapping(
        '[[rule]]\nname = "wills"\ntopic = ["ot/{user}/{device}", "tr/{user}/{device}"]\n'
        'ignore = true\n[rule.match]\n"_type" = "lwt"\n'
        '[[rule]]\nname = "loc"\ntopic = ["tr/{user}/{device}", "ot/{user}/{device}"]\n'
        'sensor_id = "{user}-{device}"\n[rule.time]\nfield = "tst"\n'
    )
    now = int(time.time())
    assert taken(m, "tr/jane/phone", b'{"_type": "lwt", "tst": 1}') == ("wills", True)
    result = m.decode("ot/jane/phone", b'{"lat": 52.5, "tst": %d}' % now, now, LIMITS)
    assert [(r.sensor_id, r.values) for r in result.decoded.readings] == [
        ("jane-phone", {"lat": 52.5})
    ]


def test_overlapping_filters_of_list_rules_are_subscribed_once() -> None:
    """Subscriptions stay disjoint: a filter of a list that another rule's covers is left
    out, and two that partly overlap are joined, as for rules of one filter."""
    m = mapping(
        '[[rule]]\nname = "a"\ntopic = ["z/bridge/#", "y/+"]\nignore = true\n'
        '[[rule]]\nname = "b"\ntopic = ["z/+", "y/+/x"]\nformat = "ingest"\n'
        '[[rule]]\nname = "c"\ntopic = "y/#"\nignore = true\n'
    )
    assert m.subscriptions() == ("z/+/#", "y/#")


def test_sparkplug_and_homie_stay_one_filter_and_homie_reads_the_others() -> None:
    """The stateful formats take one filter per rule; a list rule of another format
    beside a Homie rule leaves the Homie rule its narrowed subscriptions."""
    m = mapping(
        '[[rule]]\nname = "chores"\ntopic = ["wled/+/status", "wled/all"]\nignore = true\n'
        '[[rule]]\nname = "homie"\ntopic = "homie/#"\nformat = "homie"\n'
    )
    topics = m.shared_subscriptions(m.subscriptions(), None)
    assert topics[:3] == ("homie/+/+/+/$datatype", "homie/+/+/+/$unit", "homie/+/+/+/$format")
    assert topics[3:5] == ("wled/+/status", "wled/all")


@pytest.mark.parametrize(
    ("topic", "error"),
    [
        ("[]", "topic: an empty list (give one topic filter or more)"),
        ('["a/b", 3]', "topic: '3' in the list is not a string"),
        ('["a/b", ["c"]]', "topic: \"['c']\" in the list is not a string"),
        ("{a = 1}", "topic must be a topic filter or a list of 1 to 64 topic filters"),
        ("[" + ", ".join(f'"t/{n}"' for n in range(65)) + "]", "a list of 1 to 64 topic"),
        ('["a/b", "a/b"]', "topic 'a/b' is listed twice"),
        ('["a/#", "a/+/c"]', "topic 'a/+/c' is taken by 'a/#', listed too: leave it out"),
        ('["a/+/c", "a/b/c"]', "topic 'a/b/c' is taken by 'a/+/c', listed too: leave it out"),
        ('["a/b", "c/#/d"]', "topic 'c/#/d': '#' must be the last level"),
        ('["a/b", ""]', "topic must be a non-empty MQTT topic filter"),
        ('["a/b", "$share/g/c"]', "topic: use --shared-group, not a $share/ filter"),
        ('["a/{x}", "b/x{y}"]', "'+', '#' and {capture} must fill a whole level"),
        (
            '["a/{x}", "b/{y}"]',
            "topic 'b/{y}': every filter of a rule must capture the same names as the first ({x})",
        ),
        (
            '["a/{x}/{y}", "b/{x}"]',
            "the same names as the first ({x}, {y})",
        ),
        (
            '["a/{x#}", "b/{x}"]',
            "topic 'b/{x}': every filter of a rule must capture the same names as the first ({x#})",
        ),
        ('["a/b", "c/{x}"]', "as the first (none)"),
    ],
)
def test_bad_topic_lists_are_refused_in_one_line(topic: str, error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(f'[[rule]]\nname = "r"\ntopic = {topic}\nignore = true\n', "--mapping m.toml")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("--mapping m.toml: rule 'r': ")
    assert error in message


@pytest.mark.parametrize("fmt", ["sparkplug", "homie"])
def test_a_stateful_format_takes_one_filter(fmt: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(f'[[rule]]\nname = "r"\ntopic = ["a/#", "b/#"]\nformat = "{fmt}"\n', "m")
    assert str(caught.value) == (
        f"m: rule 'r': format {fmt} takes one topic filter per rule, not a list"
    )


def test_captures_in_a_different_order_are_the_same_captures() -> None:
    m = mapping(
        '[[rule]]\nname = "r"\ntopic = ["a/{sensor_id}/{measurement}", '
        '"b/{measurement}/{sensor_id}"]\nformat = "value"\n'
    )
    assert m.rules[0].captures == ("sensor_id", "measurement")
    assert m.match("b/t/s").captures == {"sensor_id": "s", "measurement": "t"}  # type: ignore[union-attr]


def test_check_names_the_rule_and_the_filter_that_ignored(
    capsys: pytest.CaptureFixture[str],
) -> None:
    m = mapping(WLED)
    assert check(m, "wled/kitchen/status", "online") == 0
    assert check(m, "wled/all", "T") == 0
    assert check(m, "wled/kitchen/g", "128") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [
        "ignored by rule wled-housekeeping (topic filter wled/+/status)",
        "ignored by rule wled-housekeeping (topic filter wled/all)",
    ]
    assert out[2].startswith('{"rule":"wled","sensor_id":"kitchen"')


def test_the_docs_example_prints_what_the_page_shows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/mapping.md's example of a rule listing filters, its ``ingest check`` lines."""
    page = (Path(__file__).parents[2] / "docs" / "mapping.md").read_text()
    section = page.split("## Several topic filters in one rule", 1)[1].split("\n## ", 1)[0]
    rules = section.split("```toml\n", 1)[1].split("```", 1)[0]
    shell = section.split("```sh\n", 1)[1].split("```", 1)[0]
    m = mapping(rules)
    commands = shell.split("$ ")[1:]
    assert len(commands) >= 3
    for command in commands:
        line, *shown = command.strip().split("\n")
        args = shlex.split(line)
        assert args[:4] == ["ingest", "check", "--mapping", "rules.toml"]
        check(m, args[5], args[6])
        printed = capsys.readouterr().out.strip().split("\n")
        if shown[0].startswith("{"):  # timed at arrival: the time is the run's
            assert printed[0].split('"ts"')[0] == shown[0].split('"ts"')[0]
            assert printed[0].split('"values"')[1] == shown[0].split('"values"')[1]
        else:
            assert printed == shown
