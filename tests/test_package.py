"""The package as a user meets it: every error importable from the top, typed, licensed."""

import importlib.resources
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

import filechannel
from filechannel import errors

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_every_error_a_user_may_catch_is_importable_from_filechannel():
    ours = [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, errors.FileChannelError)]
    assert len(ours) > 20
    for cls in ours:
        assert getattr(filechannel, cls.__name__) is cls, cls.__name__
        assert cls.__name__ in filechannel.__all__


def test_the_package_is_marked_typed_and_licensed():
    assert importlib.resources.files("filechannel").joinpath("py.typed").is_file()
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'license = "Apache-2.0"' in pyproject and 'license-files = ["LICENSE"]' in pyproject
    assert 'filechannel = ["py.typed"]' in pyproject


# A sitecustomize that makes the named modules (and their submodules) fail to import, as on a
# machine where they are not installed: what a user without the extra or the compiler meets.
_BLOCKER = """
import os, sys

class _NotInstalled:
    names = os.environ["FC_TEST_NOT_INSTALLED"].split(",")

    def find_spec(self, name, path=None, target=None):
        if any(name == n or name.startswith(n + ".") for n in self.names):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""


def _without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """The environment of a subprocess in which ``modules`` cannot be imported."""
    (tmp_path / "sitecustomize.py").write_text(_BLOCKER)
    path = os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "FC_TEST_NOT_INSTALLED": ",".join(modules)}


@pytest.mark.parametrize("missing", ["pyspark", "pyarrow"])
def test_filechannel_spark_without_pyspark_says_to_install_the_extra(tmp_path, missing):
    env = _without(tmp_path, missing)
    code = f"import filechannel, sys; assert {missing!r} not in sys.modules; import filechannel.spark"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: filechannel.spark needs pyspark >= 4 and pyarrow"), proc.stderr
    assert "pip install 'filechannel[spark]'" in last


def test_the_spark_errors_are_importable_without_pyspark(tmp_path):
    code = (
        "import sys\n"
        "from filechannel import DataLossError, OffsetOutOfRangeError, SinkError, FileChannelError\n"
        "assert issubclass(DataLossError, OffsetOutOfRangeError) and issubclass(SinkError, FileChannelError)\n"
        "assert not any(m.startswith('pyspark') for m in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_without(tmp_path, "pyspark"))
    assert proc.returncode == 0, proc.stderr
    # The same classes as the Spark integration raises (here, where pyspark is installed).
    from filechannel.spark import errors as spark_errors

    assert spark_errors.SinkError is filechannel.SinkError and spark_errors.DataLossError is filechannel.DataLossError


def test_without_the_c_extensions_the_package_runs_and_says_so(tmp_path):
    env = _without(tmp_path, "filechannel.engine._codec", "filechannel.engine._readahead")
    code = "import filechannel; print(filechannel.native_extensions())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.stdout == "{'codec': False, 'readahead': False}\n", proc.stderr
    script = Path(sys.executable).parent / "filechannel"
    env["FILECHANNEL_ROOT"] = str(tmp_path / "root")
    version = subprocess.run([str(script), "--version"], capture_output=True, text=True, env=env, timeout=60)
    assert version.stdout == f"filechannel {filechannel.__version__} (native codec: no, readahead: no)\n"
    # ...and works: a record in and out through the pure-Python code.
    run: dict[str, Any] = {"capture_output": True, "env": env, "timeout": 60}
    assert subprocess.run([str(script), "produce", "t"], input=b"hello\n", **run).returncode == 0
    out = subprocess.run([str(script), "consume", "t", "--from-beginning", "--no-follow"], **run)
    assert out.stdout == b"hello\n", out.stderr
    # The producer's Python short path: its future keeps offset, timestamp and size as slots.
    code = (
        "import sys; from filechannel.client import Producer\n"
        "with Producer(sys.argv[1]) as p:\n"
        "    p.send('t', b'warm'); f = p.send('t', b'abc')\n"
        "print(type(f).__name__, f.get().offset, f.get().serialized_value_size, f.get().timestamp > 0)\n"
    )
    sent = subprocess.run(
        [sys.executable, "-c", code, env["FILECHANNEL_ROOT"]], capture_output=True, text=True, env=env, timeout=60
    )
    assert sent.stdout == "SentFuture 2 3 True\n", sent.stderr


def _tracked_copy(dest: Path) -> Path:
    """The checkout's sources without build output, so building there leaves the checkout as it is."""
    skip = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.so", ".pytest_cache")
    return Path(shutil.copytree(ROOT, dest, ignore=skip))


def test_the_sdist_carries_the_license_the_c_sources_py_typed_and_what_the_readme_and_makefile_use(tmp_path):
    src = _tracked_copy(tmp_path / "src")
    # setuptools' PEP 517 hook, as `python -m build --sdist` calls it (no network, no new venv).
    code = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "dist")], cwd=src, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    name = proc.stdout.strip().splitlines()[-1]
    with tarfile.open(tmp_path / "dist" / name) as sdist:
        top = name.removesuffix(".tar.gz")
        members = {m.name.removeprefix(top + "/") for m in sdist.getmembers()}
        pkg_info = sdist.extractfile(f"{top}/PKG-INFO").read().decode()  # type: ignore[union-attr]
    linked = set(re.findall(r"\]\((?!https?:|#)([^)]+)\)", README.read_text()))
    assert linked, "the README links to files of the repository"
    expected = {
        "LICENSE",
        "README.md",
        "pyproject.toml",
        "setup.py",
        "filechannel/py.typed",
        "filechannel/engine/_codec.c",
        "filechannel/engine/_readahead.c",
        "examples/demo.py",
        "Makefile",
        "make/venv.sh",
        "constraints.txt",
    } | linked
    assert expected <= members, sorted(expected - members)
    assert not any(m.endswith((".so", ".pyc")) for m in members)
    assert "License-Expression: Apache-2.0" in pkg_info and "Requires-Python: >=3.11" in pkg_info
    for python in ("3.11", "3.12", "3.13"):
        assert f"Classifier: Programming Language :: Python :: {python}" in pkg_info


# The tests of the wheel run on one pytest-xdist worker, which builds it once (the C extensions
# compiled, a venv made and the wheel installed in it): a module fixture is made once per worker.
ON_THE_WHEELS_WORKER = pytest.mark.xdist_group("wheel")


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of the checkout's sources, built once for this module's tests (ON_THE_WHEELS_WORKER)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = _tracked_copy(tmp / "src")
    code = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    proc = subprocess.run([sys.executable, "-c", code, str(tmp / "dist")], cwd=src, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    shutil.rmtree(src)
    return tmp / "dist" / proc.stdout.strip().splitlines()[-1]


@ON_THE_WHEELS_WORKER
def test_the_wheel_carries_the_license_py_typed_and_only_the_package(built_wheel):
    with zipfile.ZipFile(built_wheel) as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read(f"filechannel-{filechannel.__version__}.dist-info/METADATA").decode()
    assert f"filechannel-{filechannel.__version__}.dist-info/licenses/LICENSE" in names
    assert "filechannel/py.typed" in names and "filechannel/cli/__main__.py" in names
    assert "filechannel/bench/__main__.py" in names and not any(n.startswith("filechannel/bench/results") for n in names)
    assert {n.split("/")[0] for n in names} == {"filechannel", f"filechannel-{filechannel.__version__}.dist-info"}
    assert "License-Expression: Apache-2.0" in metadata and "Classifier: Operating System :: POSIX :: Linux" in metadata


def test_python_dash_m_filechannel_is_the_command():
    proc = subprocess.run([sys.executable, "-m", "filechannel", "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith(f"filechannel {filechannel.__version__}"), proc.stderr
    usage = subprocess.run([sys.executable, "-m", "filechannel", "topics", "nosuch"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and usage.stderr.startswith("error: ")


@pytest.mark.skipif(
    Path(sys.prefix).resolve() != ROOT / ".venv", reason="checks the venv make/venv.sh makes, which runs the suite"
)
def test_makes_venv_finds_this_checkouts_package_and_starts_without_importing_a_finder(tmp_path):
    """make/venv.sh rewrites setuptools' editable .pth file to a finder that imports nothing: the
    venv's Python starts without pathlib, importlib.util and fnmatch (half its start-up CPU), and
    finds ``filechannel``, and nothing else of the checkout, in this checkout from any folder."""
    code = "import sys; print(sorted(m for m in ('pathlib', 'importlib.util', 'fnmatch') if m in sys.modules))"
    started = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert started.stdout.strip() == "[]", (
        f"the venv's Python imported {started.stdout.strip()} before running anything: is setuptools' editable "
        f"finder back (a `pip install -e .` by hand)? `rm .venv/.installed && make .venv/.installed` runs make/venv.sh again\n{started.stderr}"
    )
    code = "import filechannel, filechannel.engine._codec as c; print(filechannel.__file__); print(c.__file__)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    package, codec = found.stdout.split()
    assert Path(package) == ROOT / "filechannel" / "__init__.py" and Path(codec).parent == ROOT / "filechannel" / "engine"
    for other in ("bench", "tests", "examples"):
        none = subprocess.run([sys.executable, "-c", f"import {other}"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert none.returncode == 1 and f"No module named '{other}'" in none.stderr


@pytest.mark.parametrize("example", ["pipeline.py", "demo.py", "transactional_worker.py"])
def test_the_examples_import_what_the_package_has(example):
    """``make run`` runs examples/pipeline.py: a name the package moved fails here, in a second,
    rather than only in ``make run``."""
    code = f"import runpy; runpy.run_path({str(ROOT / 'examples' / example)!r}, run_name='not_main')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def installed(built_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed, as a user's: its dependencies are this environment's
    (a path in a .pth file: offline), not the checkout, which is on no path of its processes."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", "--no-index"]
    proc = subprocess.run([*pip, str(built_wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    )
    (Path(site.stdout.strip()) / "deps-of-this-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def _user_env(temp: Path, **extra: str) -> dict[str, str]:
    """A user's environment: no PYTHONPATH (so no checkout), ``temp`` as the temp folder."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "TMPDIR": str(temp), **extra}


@ON_THE_WHEELS_WORKER
@pytest.mark.bench
@pytest.mark.slow
def test_the_installed_bench_lists_its_options_and_writes_to_a_temp_folder(installed, tmp_path):
    """`filechannel bench` from the wheel, in a folder with a `bench` package of its own (never run):
    --help lists the harness's options; a tiny run writes its results to a new temp folder, named
    at the end, and leaves nothing else behind."""
    cwd, temp = tmp_path / "cwd", tmp_path / "temp"
    (cwd / "bench").mkdir(parents=True)
    (cwd / "bench" / "__init__.py").write_text("raise SystemExit('the bench of the working directory ran')\n")
    temp.mkdir()
    run = {"cwd": cwd, "env": _user_env(temp), "capture_output": True, "text": True, "timeout": 300}
    where = subprocess.run(
        [str(installed / "bin" / "python"), "-c", "import filechannel.bench; print(filechannel.bench.__file__)"], **run
    )
    assert where.stdout.startswith(str(installed)), where.stdout + where.stderr
    script = str(installed / "bin" / "filechannel")
    shown = subprocess.run([script, "bench", "--help"], **run)
    assert shown.returncode == 0 and shown.stdout.startswith("Usage: filechannel bench [OPTIONS]"), shown.stderr
    for option in ("--quick", "--out DIR", "--work DIR", "--only PATTERNS", "--spark"):
        assert option in shown.stdout, option
    module = subprocess.run([str(installed / "bin" / "python"), "-m", "filechannel.bench", "--help"], **run)
    assert module.returncode == 0 and module.stdout.startswith("Usage: python -m filechannel.bench [OPTIONS]"), module.stderr
    proc = subprocess.run([script, "bench", "--quick", "--only", "python floor (frames in one file)"], **run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = Path(proc.stderr.strip().splitlines()[-1].removeprefix("results written to "))
    assert out.parent == temp and out.name.startswith("fc-bench-results-")
    assert sorted(os.listdir(temp)) == [out.name] and os.listdir(cwd) == ["bench"]  # the work folder is gone
    assert sorted(os.listdir(out)) == ["results.json", "results.md", "throughput.png"]
    data = json.loads((out / "results.json").read_text())
    assert {r["backend"] for r in data["rows"]} == {"python floor (frames in one file)"}
    assert data["machine"]["command"] == "filechannel bench --quick --only 'python floor (frames in one file)'"
    assert "| produce | python floor (frames in one file) |" in proc.stdout


@ON_THE_WHEELS_WORKER
@pytest.mark.bench
@pytest.mark.slow
def test_the_installed_bench_without_a_peer_or_matplotlib_skips_their_rows_saying_why(installed, tmp_path):
    """queuelib and matplotlib not importable (in the bench process and the ones it spawns):
    queuelib's rows are skipped rows naming the extra to install, the chart is left out with the
    reason in results.md, and no traceback is printed."""
    (tmp_path / "sitecustomize.py").write_text(_BLOCKER)
    temp, out = tmp_path / "temp", tmp_path / "out"
    temp.mkdir()
    env = _user_env(temp, PYTHONPATH=str(tmp_path), FC_TEST_NOT_INSTALLED="queuelib,matplotlib")
    only = "queuelib,python floor (frames in one file)"
    proc = subprocess.run(
        [str(installed / "bin" / "filechannel"), "bench", "--quick", "--only", only, "--out", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())["rows"]
    queuelib = [r for r in rows if r["backend"] == "queuelib FifoDiskQueue"]
    assert len(queuelib) == 6  # produce and consume at 100 B, 1 KiB and 64 KiB
    for r in queuelib:
        assert r["skipped"] and r["error"] == "queuelib is not installed (pip install 'filechannel[bench]')", r
    assert all(r["error"] is None for r in rows if r["backend"] == "python floor (frames in one file)")
    md = (out / "results.md").read_text()
    assert "| skipped: queuelib is not installed (pip install 'filechannel[bench]') |" in md
    assert "No chart (throughput.png): matplotlib is not installed (pip install 'filechannel[bench]')." in md
    assert not (out / "throughput.png").exists() and os.listdir(temp) == []


def test_importing_filechannel_spark_imports_neither_pyarrow_nor_asyncio():
    # DESIGN.md "Spark": Spark starts a Python process per data source, read plan and stream source
    code = "import filechannel.spark, sys; print(sorted({'pyarrow', 'asyncio', 'anyio'} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "[]"


def test_the_command_imports_neither_the_crc32c_package_nor_importlib_metadata():
    # engine/checksum.py: with the C codec built its CRC is used, and the package's import (which
    # imports importlib.metadata for its version) cost more than the engine's other imports
    if not filechannel.native_extensions()["codec"]:
        pytest.skip("the C codec is not built: the crc32c package is the CRC")
    code = "import filechannel.cli, sys; print(sorted({'crc32c', 'importlib.metadata'} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "[]"


def test_the_command_and_the_client_leave_watchdog_zstd_and_tier_2_metadata_until_used():
    # Most processes that import them never wait on a channel (watchdog), compress or decompress
    # (zstandard) or touch a tier (sqlite3 for tier-2's metadata): engine/wakeup.py,
    # engine/compressed.py, client/consumer.py and client/topics.py import those where they are used.
    code = (
        "import filechannel.cli, filechannel.client, sys; "
        "print(sorted({'watchdog', 'zstandard', 'sqlite3', 'boto3', 'fsspec'} & set(sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "[]"


def test_the_client_leaves_shutil_tempfile_and_uuid_until_used():
    # shutil imports zlib, bz2 and lzma; uuid imports platform: a tenth of the client's import time
    # (measured with both, interleaved, in fresh processes). A folder removed or made
    # (engine/files.py), a topic or a group deleted, import them there.
    code = "import filechannel.client, sys; print(sorted({'shutil', 'tempfile', 'uuid', 'bz2', 'lzma'} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "[]"


def test_a_receiver_that_waits_gets_watchdog_and_is_woken_by_another_process(tmp_path):
    # The other side of the test above: a receiver's first wait imports watchdog, and another
    # process's write then wakes a waiting receiver.
    code = (
        "import sys, subprocess\n"
        "from filechannel import FileChannel\n"
        "from filechannel.errors import Timeout\n"
        "ch = FileChannel(sys.argv[1])\n"
        "rx = ch.receiver('latest')\n"
        "imported_before = 'watchdog' in sys.modules\n"
        "try:\n"
        "    rx.recv(timeout=0.05)\n"
        "except Timeout:\n"
        "    pass\n"
        "writer = subprocess.Popen([sys.executable, '-c', "
        "'import sys; from filechannel import FileChannel; "
        'c = FileChannel(sys.argv[1]); s = c.sender(); s.send(b"x"); s.flush(); c.close()\', sys.argv[1]])\n'
        "record = rx.recv(timeout=30)\n"
        "writer.wait()\n"
        "print(imported_before, 'watchdog' in sys.modules, record.value)\n"
        "ch.close()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True", "b'x'"]
