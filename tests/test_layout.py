"""The package layout: no import circles, and imports go down the rooms of the package only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ingest", "loadgen")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Each module's imports of our own modules, wherever they are (type-only and lazy
    imports included: a circle hidden behind TYPE_CHECKING still blurs who owns what)."""
    modules = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt in path:
                found.append([*path[path.index(nxt) :], nxt])
            elif len(path) < 12:
                visit(nxt, [*path, nxt])

    for start in sorted(graph):
        visit(start, [start])
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"a"}})


def test_no_module_imports_back_into_its_importers() -> None:
    assert cycles(imports()) == []


# The rooms of the package, lowest first (docs/architecture.md draws them): a module may
# import modules of its own room and of the rooms of lower ranks, never of a room of its
# own rank or higher. So the store never imports the read API, the devices' formats never
# import the pipeline, the broker side knows nothing of MongoDB, and so on.
RANKS: tuple[tuple[str, ...], ...] = (
    # shared plain data, and which twin (compiled or Python) runs
    ("ingest", "ingest.accel", "ingest.caches", "ingest.errors", "ingest.model", "ingest.retry"),
    ("ingest.tokens",),  # bearer tokens from a file: the read API's and the daemon's /metrics
    ("ingest.store",),  # MongoDB: writers, schema, sharding, error classes
    ("ingest.devices",),  # what devices publish: rules, formats, presets, their state
    ("ingest.config", "ingest.metrics"),  # settings (which carry the rules), metrics
    ("ingest.mqtt", "ingest.api", "ingest.devices.discover"),  # broker, read API, discover
    ("ingest.pipeline",),  # decode -> batch -> write -> ack, lifecycle, workers
    ("ingest.local_store",),  # ingest local's embedded store (the mongoeco emulator)
    ("ingest.local",),  # ingest local: a broker, a store and the daemons as processes
    ("ingest.cli",),  # argv and environment -> settings -> the command
    ("ingest.__main__",),
)
RANK = {room: rank for rank, rooms in enumerate(RANKS) for room in rooms}


def room_of(module: str) -> str:
    """The longest room name that ``module`` is or is inside."""
    found = [room for room in RANK if module == room or module.startswith(room + ".")]
    return max(found, key=len)


def crossings(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a room into a room of the same or a higher rank."""
    wrong = []
    for module, targets in graph.items():
        if not module.startswith("ingest"):
            continue
        here = room_of(module)
        for target in sorted(t for t in targets if t.startswith("ingest")):
            there = room_of(target)
            if there != here and RANK[there] >= RANK[here]:
                wrong.append(f"{module} imports {target} ({here} may not import {there})")
    return wrong


def test_the_crossing_finder_finds_an_import_against_the_direction() -> None:
    graph = {
        "ingest.store.schema": {"ingest.api.server"},
        "ingest.api.server": {"ingest.store.schema", "ingest.model"},
        "ingest.mqtt.source": {"ingest.api.server"},
    }
    assert crossings(graph) == [
        ("ingest.store.schema imports ingest.api.server (ingest.store may not import ingest.api)"),
        ("ingest.mqtt.source imports ingest.api.server (ingest.mqtt may not import ingest.api)"),
    ]


def test_every_module_is_in_a_room() -> None:
    graph = imports()
    assert all(room_of(module) for module in graph if module.startswith("ingest"))
    assert {room for rooms in RANKS for room in rooms} <= set(graph)


def test_imports_go_down_the_rooms_only() -> None:
    assert crossings(imports()) == []


def test_the_architecture_page_lists_the_rooms_in_rank_order() -> None:
    """docs/architecture.md's table of rooms is the rank table above, in order."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = page.split("## The rooms", 1)[1].split("\n\n", 2)[1]
    listed: list[str] = []
    for row in table.splitlines()[2:]:
        cell = row.split("|")[1]
        names = re.findall(r"`([^`]+)`", cell)
        if names[0].endswith("/") and names[0] != "ingest/":
            listed.append(names[0].rstrip("/").replace("/", "."))
        else:
            listed += [f"ingest.{name.removesuffix('.py')}" for name in names[1:]]
    assert sorted(listed) == sorted(set(RANK) - {"ingest", "ingest.__main__"})
    ranks = [RANK[room] for room in listed]
    assert ranks == sorted(ranks)
