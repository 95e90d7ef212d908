"""The pipeline's estimate of what a taken message holds: the Python function and its
compiled twin agree on every input, and raise the same for what is not a message."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.model import Inbound, Reading
from ingest.pipeline import stages
from tests.support.twins import compiled

if TYPE_CHECKING:
    from types import ModuleType


@pytest.fixture(scope="module")
def twin() -> ModuleType:
    return compiled("ingest.pipeline._stages_c")


class SubReading(Reading):
    """A Reading of a subclass: read through its attribute, not by index."""

    __slots__ = ()


class Sized:
    """A values object with any length (or none that fits an index)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


values = st.one_of(
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=40),
    st.lists(st.integers(), max_size=5),
    st.builds(Sized, st.sampled_from([0, 3, sys.maxsize, sys.maxsize - 1])),
    st.sampled_from([5, None]),
)
readings = st.one_of(
    st.builds(lambda v: Reading("s", None, 0.0, v), values),
    st.builds(lambda v: SubReading("s", None, 0.0, v), values),
    st.sampled_from([object(), tuple.__new__(Reading, ("s",))]),
)
messages = st.one_of(
    st.builds(
        Inbound,
        st.text(max_size=30),
        st.binary(max_size=300),
        st.just(1),
        st.just(1),
        st.just(0),
        st.just(0.0),
    ),
    st.sampled_from([object(), Inbound("t", None, 1, 1, 0, 0.0)]),
)  # type: ignore[arg-type]
reject_docs = st.lists(
    st.one_of(
        st.fixed_dictionaries({"payload": st.binary(max_size=50), "detail": st.text(max_size=20)}),
        st.just({"payload": b""}),
    ),
    max_size=3,
)


def outcome(fn: Any, *args: Any) -> tuple[Any, ...]:
    try:
        return ("returned", fn(*args))
    except Exception as exc:  # noqa: BLE001 - the twins must raise the same, whatever it is
        return ("raised", type(exc), str(exc))


@given(
    messages,
    st.one_of(st.lists(readings, max_size=120), st.lists(readings, max_size=3).map(tuple)),
    reject_docs,
)
def test_held_bytes_is_the_same_from_both_twins(
    twin: ModuleType, message: Any, taken: Any, docs: Any
) -> None:
    expected = outcome(stages.held_bytes_py, message, taken, docs)
    got = outcome(twin.held_bytes, message, taken, docs)
    assert got == expected
    if expected[0] == "returned":
        assert type(got[1]) is int


def test_the_twins_estimate_with_the_same_sizes(twin: ModuleType) -> None:
    for name in ("MESSAGE_BYTES", "READING_BYTES", "VALUE_BYTES", "REJECT_DOC_BYTES"):
        assert getattr(twin, name) == getattr(stages, name), name
    message = Inbound("sensors/a", b"x" * 10, 1, 1, 0, 0.0)
    taken = [Reading("a", None, 0.0, {"t": 1, "h": 2}), Reading("a", None, 0.0, {"t": 1})]
    expected = stages.MESSAGE_BYTES + 10 + 9 + 2 * stages.READING_BYTES + 3 * stages.VALUE_BYTES
    assert twin.held_bytes(message, taken, []) == expected
    assert stages.held_bytes_py(message, taken, []) == expected
    huge = [Reading("a", None, 0.0, Sized(sys.maxsize))] * 3  # a count past a C integer's
    assert (
        twin.held_bytes(message, huge, [])
        == stages.held_bytes_py(message, huge, [])
        > (3 * sys.maxsize)
    )


class Growing:
    """Values whose len() adds a reading to the list being counted, four times."""

    def __init__(self, taken: list[Any]) -> None:
        self.taken = taken

    def __len__(self) -> int:
        if len(self.taken) < 5:
            self.taken.append(Reading("s", None, 0.0, Growing(self.taken)))
        return 1


def test_a_list_that_grows_while_counted_is_counted_as_python_counts_it(twin: ModuleType) -> None:
    message = Inbound("t", b"", 1, 1, 0, 0.0)
    for fn in (stages.held_bytes_py, twin.held_bytes):
        taken: list[Any] = []
        taken.append(Reading("s", None, 0.0, Growing(taken)))
        assert fn(message, taken, []) == (
            stages.MESSAGE_BYTES + 1 + stages.READING_BYTES + 5 * stages.VALUE_BYTES
        )
