"""``json``: one JSON object is one reading; nested objects flatten into one level.

``{"temperature": 21.7, "update": {"state": "idle"}}`` becomes the fields
``temperature`` and ``update_state`` (joined with the rule's ``flatten``). An array of
objects is several readings. Arrays inside a reading, and nesting deeper than
:data:`MAX_DEPTH`, are refused field by field; more than :data:`MAX_FIELDS` fields refuse
the reading.
"""

from __future__ import annotations

from ingest import accel
from ingest.devices.formats import _jsonparse_py

# The rules are written once, in _jsonparse_py.py, compiled as _jsonparse_c where built.
_COMPILED = "ingest.devices.formats._jsonparse_c"
parse_py = accel.pick(_jsonparse_py.parse, _COMPILED, "parse")  # the whole payload
parse_selective = accel.pick(_jsonparse_py.parse_selective, _COMPILED, "parse_selective")
walk = accel.pick(_jsonparse_py.walk, _COMPILED, "walk")
ABSENT = accel.pick(_jsonparse_py.ABSENT, _COMPILED, "ABSENT")  # what walk() gives if absent
template_text = accel.pick(_jsonparse_py.template_text, _COMPILED, "template_text")
# Where the selective scanner (the kernel _json_c.pyx) is built, rules with root or each
# read only what they need of a payload.
parse = parse_selective if _jsonparse_py.selective() else parse_py
