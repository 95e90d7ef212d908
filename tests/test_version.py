"""The version is written once, as ``ingest.__version__``: the package's metadata and the
command line take it from there; CHANGELOG.md says what changed, in Keep a Changelog's
shape."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ingest import __version__
from tests.support.procs import ROOT, clean_env


@pytest.mark.process
def test_the_built_metadata_takes_the_version_from_the_package(tmp_path: Path) -> None:
    """A copy of the source whose ``__version__`` says 9.8.7 builds as 9.8.7."""
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    package = tmp_path / "ingest"
    package.mkdir()
    init = (ROOT / "ingest" / "__init__.py").read_text(encoding="utf-8")
    assert init.count(f'__version__ = "{__version__}"') == 1
    (package / "__init__.py").write_text(init.replace(__version__, "9.8.7"), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "setup.py", "--version"],
        cwd=tmp_path,
        env=clean_env() | {"INGEST_NO_EXTENSIONS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "9.8.7"


@pytest.mark.process
def test_the_installed_package_and_the_cli_say_the_same_version() -> None:
    assert importlib.metadata.version("iot-ingest") == __version__
    done = subprocess.run(
        [sys.executable, "-m", "ingest", "--version"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == f"ingest {__version__}"


@pytest.mark.process
def test_no_other_file_writes_the_version() -> None:
    """Outside ``ingest/__init__.py`` (and the changelog's release headings), no tracked
    text file holds the version string."""
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    holding = [
        name
        for name in files
        if name not in {"ingest/__init__.py", "CHANGELOG.md"}
        and Path(ROOT / name).suffix in {".py", ".toml", ".md", ".yaml", ".yml", ".cfg", ".txt"}
        and re.search(rf"(?<![\d.]){re.escape(__version__)}(?![\d.])", (ROOT / name).read_text())
    ]
    assert holding == []


KINDS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def test_the_changelog_keeps_its_shape_and_is_linked() -> None:
    """Unreleased first, then releases ``[x.y.z] - YYYY-MM-DD`` newest first; each section's
    entries under Keep a Changelog's kinds; the README and the development page link it."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    releases = re.findall(r"^## (.*)$", text, re.MULTILINE)
    assert releases[0] == "[Unreleased]"
    versions = []
    for heading in releases[1:]:
        match = re.fullmatch(r"\[(\d+)\.(\d+)\.(\d+)\] - \d{4}-\d{2}-\d{2}", heading)
        assert match, heading
        versions.append(tuple(int(n) for n in match.groups()))
    assert versions == sorted(versions, reverse=True)
    for section in re.split(r"^## .*$", text, flags=re.MULTILINE)[1:]:
        kinds = re.findall(r"^### (.*)$", section, re.MULTILINE)
        assert kinds, "a release without entries"
        assert set(kinds) <= KINDS
        assert len(kinds) == len(set(kinds))
    for page in ("README.md", "docs/development.md"):
        assert "CHANGELOG.md)" in (ROOT / page).read_text(encoding="utf-8"), page
