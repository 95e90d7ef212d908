"""The README and docs/: links that resolve, flags and tests that exist, a short README."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ingest.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted(
    [README, ROOT / "CHANGELOG.md", ROOT / "tests" / "README.md", *(ROOT / "docs").rglob("*.md")]
)

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans (links there are not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor GitHub (and MkDocs' toc with its GitHub-style slugs) gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    """Relative links of ``page`` whose file or heading does not exist."""
    problems = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
            problems.append(f"{target}: no heading #{anchor}")
    return problems


def test_the_link_checker_finds_missing_files_and_headings(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Title\n\n## Two words `code`\n")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md) [ok](a.md#two-words-code) [ok](#here) [web](https://x.y/z)\n"
        "# Here\n`[not a link](nowhere.md)`\n```\n[nor](this.md)\n```\n"
        "[bad](missing.md) [bad](a.md#nope) [bad](#absent)\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "a.md#nope: no heading #nope",
        "#absent: no heading #absent",
    ]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_every_docs_page_is_reachable_from_the_index() -> None:
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    linked = {target.partition("#")[0] for target in LINK.findall(index)}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert pages <= linked


def test_the_readme_is_a_landing_page() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text) < 12_000
    assert "docker compose -f deploy/compose.yaml up" in text
    assert "ingest local" in text
    assert "scripts/test" in text


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_no_diary_in_the_docs(page: Path) -> None:
    text = page.read_text(encoding="utf-8").lower()
    for phrase in ("our machines", "please report", "the open issue", "contributing"):
        assert not re.search(rf"\b{phrase}\b", text), phrase
    assert not re.search(r"\bcommit [0-9a-f]{7,40}\b", text)


def flags(command: str) -> set[str]:
    parser = build_parser({})
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        option
        for action in sub.choices[command]._actions
        for option in action.option_strings
        if option.startswith("--")
    } - {"--help"}


@pytest.mark.parametrize("command", ["run", "init-db", "local", "api"])
def test_the_configuration_page_names_every_flag(command: str) -> None:
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    missing = sorted(flag for flag in flags(command) if f"`{flag}`" not in page)
    assert missing == []


def test_every_test_the_docs_name_exists() -> None:
    defined = {
        m.group(1)
        for path in (ROOT / "tests").rglob("test_*.py")
        for m in re.finditer(r"def (test_\w+)", path.read_text(encoding="utf-8"))
    }
    named = {
        m.group(1)
        for page in PAGES
        for m in re.finditer(r"`(test_\w+?)(?:\[\w+\])?`", page.read_text(encoding="utf-8"))
    }
    named = {n for n in named if not n.endswith("_py") and "." not in n}
    assert sorted(named - defined) == []


TEST_FILES = {path.name: path for path in (ROOT / "tests").rglob("test_*.py")}


def test_every_test_the_docs_name_by_file_is_in_that_file() -> None:
    """``file.py::test_name`` (a file anywhere under ``tests/``) names a test of that file;
    ``::test_name`` after it names a test of the same file (the fault model's and MongoDB
    errors' tables)."""
    missing, seen = [], 0
    for page in PAGES:
        for cell in re.split(r"\||\n\n", page.read_text(encoding="utf-8")):
            current = None
            for m in re.finditer(
                r"`(?:(?:tests/(?:\w+/)?)?(test_\w+\.py))?::(test_\w+?)(?:\[[\w-]+\])?`", cell
            ):
                current, seen = m.group(1) or current, seen + 1
                if current is None:
                    missing.append(f"{page.name}: ::{m.group(2)} without a file")
                    continue
                path = TEST_FILES.get(current)
                text = path.read_text(encoding="utf-8") if path else ""
                if not re.search(rf"def {m.group(2)}\(", text):
                    missing.append(f"{page.name}: {current}::{m.group(2)}")
    assert seen > 50  # the pattern still matches how the pages cite tests
    assert missing == []


@pytest.mark.process
def test_the_sparkplug_example_prints_what_the_page_shows() -> None:
    """docs/sparkplug.md's ``ingest check`` of an NBIRTH, run as shown: the same line."""
    page = (ROOT / "docs" / "sparkplug.md").read_text(encoding="utf-8")
    block = page.split("```console\n$ ", 1)[1].split("```", 1)[0]
    command, _, shown = block.rpartition("\n{")
    python = shlex.quote(sys.executable)
    command = command.replace("python -c", f"{python} -c").replace(
        "| ingest check", f"| {python} -m ingest check"
    )
    done = subprocess.run(
        command, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{" + shown.strip()
    assert '"sensor_id":"Plant1/Gateway1"' in shown


def test_the_development_page_names_every_runtime_dependency() -> None:
    """docs/development.md's "Run time dependencies" is pyproject.toml's list."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = [
        re.split(r"[\s<>=!~;\[]", spec, maxsplit=1)[0].lower() for spec in project["dependencies"]
    ]
    page = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    listed = page.split("Run time dependencies:", 1)[1].split("Nothing else.", 1)[0]
    listed = " ".join(listed.lower().split())
    assert [name for name in names if name not in listed] == []
