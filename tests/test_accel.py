"""Which twin runs, compiled or Python: chosen at import, forced off by
INGEST_NO_EXTENSIONS, said once at start and exported as ingest_build_info."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ingest import accel
from ingest.mqtt import _wire_py
from tests.support.procs import free_port
from tests.support.twins import cimported_kernels, compiled

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.support.procs import Daemon


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """accel with nothing picked yet (its choices are made once per process)."""
    monkeypatch.setattr(accel, "_loaded", {})
    monkeypatch.setattr(accel, "_errors", {})


@pytest.mark.usefixtures("fresh")
def test_the_compiled_twin_is_picked_when_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(accel.ENV, raising=False)
    twin = compiled("ingest.mqtt._wire_c")
    assert accel.pick(_wire_py.pubacks, "ingest.mqtt._wire_c", "pubacks") is twin.pubacks
    assert accel.accelerated()
    assert accel.describe() == "accelerators: compiled (_wire_c)"


@pytest.mark.usefixtures("fresh")
@pytest.mark.parametrize("value", ["1", "true", "yes"])
def test_no_extensions_forces_the_python_twin(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(accel.ENV, value)
    assert accel.pick(_wire_py.pubacks, "ingest.mqtt._wire_c", "pubacks") is _wire_py.pubacks
    assert not accel.accelerated()
    assert accel.describe() == "accelerators: off (INGEST_NO_EXTENSIONS is set): pure Python"


@pytest.mark.usefixtures("fresh")
def test_zero_means_not_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(accel.ENV, "0")
    twin = compiled("ingest.mqtt._wire_c")
    assert accel.pick(_wire_py.pubacks, "ingest.mqtt._wire_c", "pubacks") is twin.pubacks


@pytest.mark.usefixtures("fresh")
def test_a_twin_that_is_not_built_falls_back_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(accel.ENV, raising=False)
    assert accel.pick(_wire_py.pubacks, "ingest.mqtt._absent_c", "pubacks") is _wire_py.pubacks
    assert not accel.accelerated()
    assert accel.describe() == "accelerators: not built (no C compiler at install?): pure Python"
    compiled("ingest.mqtt._wire_c")
    accel.pick(_wire_py.pubacks, "ingest.mqtt._wire_c", "pubacks")
    assert accel.describe() == "accelerators: partly built, pure Python for _absent_c"


def test_children_keep_the_choice_of_path() -> None:
    assert accel.inherited({"INGEST_NO_EXTENSIONS": "1", "INGEST_DB": "x"}) == {
        "INGEST_NO_EXTENSIONS": "1"
    }
    assert accel.inherited({"INGEST_DB": "x"}) == {}


# "0" rather than nothing: the suite's run without the accelerators sets the variable for
# every child.
@pytest.mark.parametrize(
    ("env", "accelerated", "line"),
    [
        ({"INGEST_NO_EXTENSIONS": "0"}, "true", "accelerators: compiled ("),
        (
            {"INGEST_NO_EXTENSIONS": "1"},
            "false",
            "accelerators: off (INGEST_NO_EXTENSIONS is set): pure Python",
        ),
    ],
)
def test_the_daemon_says_once_which_path_runs_and_exports_it(
    daemon: Callable[..., Daemon], env: dict[str, str], accelerated: str, line: str
) -> None:
    if accelerated == "true":
        compiled("ingest.mqtt._wire_c")
    nowhere = f"mongodb://127.0.0.1:{free_port()}/?serverSelectionTimeoutMS=500"
    proc = daemon("--dry-run", mongodb_uri=nowhere, env=env)
    found: dict[str, Any] = {
        k: v for k, v in proc.metrics().items() if k.startswith("ingest_build_info{")
    }
    assert len(found) == 1, found
    ((labels, value),) = found.items()
    assert value == 1
    assert f'accelerated="{accelerated}"' in labels
    assert proc.stop() == 0
    assert proc.logs().count("accelerators: ") == 1
    assert line in proc.logs()


def test_the_start_up_line_accounts_for_every_twin() -> None:
    """Every compiled module in the tree is picked by a module the line imports first."""
    from ingest.cli import accelerators  # noqa: PLC0415 - the daemon's own helper

    root = Path(__file__).resolve().parents[1]
    sources = {
        ".".join(p.relative_to(root).with_suffix("").parts)
        for pattern in ("_*_c.pyx", "_*_c.pxd")  # kernels, and compiled Python
        for p in (root / "ingest").rglob(pattern)
    }
    cimported = cimported_kernels(root)  # come with the modules that cimport them
    accelerators()
    assert sources - cimported <= set(accel._loaded), sources - cimported - set(accel._loaded)
