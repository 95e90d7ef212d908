"""Which rule-language features the mapping in use accepts, probed once by parsing.

Discover proposes the shortest rules the language allows: a json rule that names its
measurement from topic captures (``measurement = "{property}"``), a last-level capture
of several levels (``{property#}``), payload selection (``[rule.match]``), an ignore
rule listing several topic filters (``topic = [...]``). Where the
mapping does not accept one yet, it proposes what it does accept (a rule per topic
depth, a ``keep`` list) and says so in a NOTE.
"""

from __future__ import annotations

from functools import cache

from ingest.devices.rules import parse
from ingest.errors import ConfigError

_PROBES = {
    "json_measurement": (
        '[[rule]]\nname = "p"\ntopic = "a/{x}"\nformat = "json"\nsensor_id = "s"\n'
        'measurement = "{x}"\n'
    ),
    "multi_level": (
        '[[rule]]\nname = "p"\ntopic = "a/{x#}"\nformat = "json"\nsensor_id = "s"\n'
        'measurement = "{x}"\n'
    ),
    "match": (
        '[[rule]]\nname = "p"\ntopic = "a/b"\nsensor_id = "s"\n[rule.match]\n"_type" = "x"\n'
        '[[rule]]\nname = "q"\ntopic = "a/c"\nignore = true\n[rule.match]\n'
        '"type" = ["x", "y"]\n'
    ),
    "topic_list": '[[rule]]\nname = "p"\ntopic = ["a/+/b", "a/c"]\nignore = true\n',
}


@cache
def supports(feature: str) -> bool:
    """Whether the mapping accepts a feature: json_measurement, multi_level, match, topic_list."""
    try:
        parse(_PROBES[feature], "probe")
    except ConfigError:
        return False
    return True
