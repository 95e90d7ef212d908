"""How the package is built: the compiled accelerators where a C compiler is, the
pure-Python path where none is, and an sdist that carries what compiles them.

Every accelerator counts (a ``.pyx`` kernel, or a ``_*_py.py`` compiled with its ``.pxd``),
whichever twins exist. The wheels are built from a copy of the source with pip, as
``pip install .`` builds them (without build isolation, so offline: setuptools and Cython
come from the test extra).
"""

from __future__ import annotations

import ast
import importlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from ingest import accel
from tests.support.procs import ROOT, clean_env
from tests.support.twins import cimported_kernels

# What `pip install .` reads; the in-place builds of the checkout stay out of the copy.
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "ingest", "loadgen")
BUILT = shutil.ignore_patterns("*.so", "*.pyd", "*.c", "*.html", "__pycache__")


def module_of(source: Path) -> str:
    return ".".join(source.relative_to(ROOT).with_suffix("").parts)


def accelerator_sources() -> dict[str, list[Path]]:
    """Compiled module -> its sources, as setup.py finds them: a ``.pyx`` kernel, or a
    ``_<name>_py.py`` compiled with the ``_<name>_c.pxd`` beside it."""
    found = {module_of(pyx): [pyx] for pyx in ROOT.glob("ingest/**/_*_c.pyx")}
    for pxd in ROOT.glob("ingest/**/_*_c.pxd"):
        python = pxd.with_name(pxd.name.removesuffix("_c.pxd") + "_py.py")
        found.setdefault(module_of(pxd), [pxd, python])
    return dict(sorted(found.items()))


ACCELERATORS = accelerator_sources()


def picks() -> list[tuple[str, str, str, str]]:
    """(module, attribute, compiled module, function) of every module-level
    ``attribute = accel.pick(python_twin, "compiled.module", "function")``; the names may
    be module-level string constants."""
    found = []
    for path in sorted((ROOT / "ingest").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        constants: dict[str, str] = {}
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.Assign):
                continue
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                constants |= {ast.unparse(target): node.value.value for target in node.targets}
            if isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "accel.pick":
                compiled, function = (
                    str(arg.value) if isinstance(arg, ast.Constant) else constants[ast.unparse(arg)]
                    for arg in node.value.args[1:]
                )
                found += [
                    (module, ast.unparse(target), compiled, function) for target in node.targets
                ]
    return found


def cannot_compile() -> str | None:
    """Why this Python cannot compile an extension here, or None when it can."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    if shutil.which(shlex.split(cc)[0]) is None:
        return f"no C compiler ({cc})"
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    if not headers.exists():
        return f"no Python headers ({headers}; Debian: python3-dev)"
    return None


def source_copy(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=BUILT)
        elif (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    return src


def build_wheel(src: Path, **env: str) -> tuple[Path, str]:
    """The wheel ``pip wheel`` builds from ``src`` with ``env`` (without
    INGEST_NO_EXTENSIONS unless given), and the build's output."""
    environ = {k: v for k, v in clean_env().items() if k != accel.ENV} | env
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--verbose",
            "--wheel-dir",
            str(src / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        env=environ,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = (src / "dist").glob("*.whl")
    return wheel, done.stdout + done.stderr


def test_every_accelerator_is_the_twin_of_a_python_function() -> None:
    assert ACCELERATORS, "no ingest/**/_*_c.pyx or _*_c.pxd"
    picked = {compiled for _, _, compiled, _ in picks()}
    kernels = cimported_kernels(ROOT)  # used only by compiled modules, through cimport
    assert picked == set(ACCELERATORS) - kernels
    assert kernels <= set(ACCELERATORS)
    for sources in ACCELERATORS.values():
        assert all(source.is_file() for source in sources), sources


def test_where_a_compiler_is_the_compiled_twins_run() -> None:
    """The suite's run with the accelerators runs compiled code: each one is built, not
    older than its source, and what its Python module hands out."""
    if accel.disabled():
        pytest.skip(f"{accel.ENV} is set: this run is the pure-Python one")
    if (why := cannot_compile()) is not None:
        pytest.skip(f"the accelerators cannot be built here: {why}")
    for module, attribute, compiled, function in picks():
        try:
            extension = importlib.import_module(compiled)
        except ImportError as exc:
            pytest.fail(
                f"{compiled} is not built ({exc}): run scripts/env.sh, or "
                ".venv/bin/python setup.py build_ext --inplace"
            )
        for source in ACCELERATORS[compiled]:
            assert Path(str(extension.__file__)).stat().st_mtime >= source.stat().st_mtime, (
                f"{compiled} is older than {source.name}: run scripts/env.sh"
            )
        chosen = getattr(importlib.import_module(module), attribute)
        assert chosen is getattr(extension, function), f"{module}.{attribute}"


@pytest.mark.process
def test_without_a_c_compiler_pip_installs_the_pure_python_path(tmp_path: Path) -> None:
    src = source_copy(tmp_path)
    nothing = tmp_path / "bin"
    nothing.mkdir()
    wheel, output = build_wheel(src, PATH=str(nothing), CC="no-such-cc")
    for module in ACCELERATORS:  # tried, and given up with a warning
        assert f'building extension "{module}" failed' in output
    names = zipfile.ZipFile(wheel).namelist()
    assert "ingest/accel.py" in names
    assert [n for n in names if n.endswith((".so", ".pyd", ".c", ".pyx"))] == []
    assert "ingest/NO_EXTENSIONS" not in names
    assert said_by(wheel, tmp_path) == (
        "accelerators: not built (no C compiler at install?): pure Python"
    )


def said_by(wheel: Path, tmp_path: Path) -> str:
    """What the daemon's start-up line says, run from ``wheel`` without INGEST_NO_EXTENSIONS
    (every module that picks a twin imported)."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        f"import ingest, {', '.join(sorted({m for m, *_ in picks()}))}\n"
        "from ingest import accel\nprint(ingest.__file__)\nprint(accel.describe())"
    )
    env = {k: v for k, v in clean_env().items() if k != accel.ENV} | {"PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    where, said = done.stdout.splitlines()
    assert Path(where).is_relative_to(site)
    return said


@pytest.mark.process
def test_ingest_no_extensions_at_build_time_builds_a_pure_python_wheel(tmp_path: Path) -> None:
    wheel, _ = build_wheel(source_copy(tmp_path), INGEST_NO_EXTENSIONS="1")
    assert wheel.name.endswith("-py3-none-any.whl")
    assert [
        n for n in zipfile.ZipFile(wheel).namelist() if n.endswith((".so", ".pyd", ".c", ".pyx"))
    ] == []
    # Started later without the variable, it says why nothing is compiled: not a compiler.
    assert said_by(wheel, tmp_path) == (
        "accelerators: off (INGEST_NO_EXTENSIONS was set at install): pure Python"
    )


@pytest.mark.process
def test_the_sdist_carries_setup_py_and_the_cython_sources(tmp_path: Path) -> None:
    src = source_copy(tmp_path)
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "-d", "dist"],
        capture_output=True,
        text=True,
        cwd=src,
        env=clean_env(),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (sdist,) = (src / "dist").glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.partition("/")[2] for name in archive.getnames()}
    wanted = {
        "setup.py",
        "pyproject.toml",
        "MANIFEST.in",
        "README.md",
        *(s.relative_to(ROOT).as_posix() for sources in ACCELERATORS.values() for s in sources),
    }
    assert wanted <= names
    assert [n for n in names if n.endswith((".so", ".pyd", ".c"))] == []


@pytest.mark.process
def test_no_built_binary_is_committed() -> None:
    """The C helpers of the bench (bench/build.sh) and the accelerators are built where they
    run, from their committed sources: a committed binary runs on one platform only, and
    goes stale when its source changes."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        )
        .stdout.decode()
        .split("\0")
    )
    binaries = []
    for name in filter(None, listed):
        path = ROOT / name
        if path.is_file():
            with path.open("rb") as handle:
                if handle.read(4) in (b"\x7fELF", b"\xcf\xfa\xed\xfe", b"MZ\x90\x00"):
                    binaries.append(name)
    assert binaries == []
