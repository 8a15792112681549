"""The README's Python examples run as written (in a temp folder, in a fresh process)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.S) if "spark" not in b]


@pytest.mark.parametrize("code", BLOCKS, ids=[b.splitlines()[0][:40] for b in BLOCKS])
def test_readme_example_runs(tmp_path, code):
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_spark_example_uses_real_options():
    spark_block = next(b for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.S) if "spark" in b)
    from filechannel.spark.options import SINK_OPTIONS, SOURCE_OPTIONS

    for name in re.findall(r'\.option\("(\w+)"', spark_block):
        assert name.lower() in SOURCE_OPTIONS | SINK_OPTIONS, name


def test_the_cli_example_runs(tmp_path):
    block = re.search(r"```sh\nexport FILECHANNEL_ROOT.*?```", README.read_text(), re.S).group(0)
    script = "\n".join(block.splitlines()[1:-1])
    bindir = Path(sys.executable).parent
    proc = subprocess.run(
        ["bash", "-ec", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        # PYTHONPATH passed on: the console script then runs the checkout under test, not an installed copy.
        env={
            "PATH": f"{bindir}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
        },
    )
    assert proc.returncode == 0, proc.stderr
    assert '"value": "hello"' in proc.stdout or "hello" in proc.stdout
