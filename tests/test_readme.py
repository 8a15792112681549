"""The README runs top to bottom, as written, in one folder, as a user who followed it would.

Every ``python`` and ``sh`` block runs in the order of the README, each in a fresh process,
all in one temp folder laid out like the checkout the set-up section leaves the user in
(``examples/`` and ``.venv`` reachable): topics made by one block are there for the next,
so two blocks creating one topic name, an absolute path or an undefined name fails here.
Not run: the set-up block itself (it clones, builds the venv and runs this suite), and the
blocks listed in NOT_RUN with the reason each cannot run as written yet.
The Spark block starts a local Spark session, so the test that runs the README is marked
``spark`` (one run of every block: a second run without the Spark block cost as much again).

The S3 block runs against the session's SeaweedFS server: its placeholders (the endpoint
``http://localhost:8333`` and the bucket ``my-bucket``, S3_PLACEHOLDERS) are replaced by the
server's endpoint and a bucket name of this run, and its access key reaches every block as a
user's would, in the environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``), never in a
file. A line ``#> TEXT`` in a block shows a line the commands above it print (on stdout or
stderr, ``...`` standing for what varies): each is checked.
"""

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from filechannel.bench.seaweed import SeaweedServer

from . import jvm_archive

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCKS = re.findall(r"```(python|sh)\n(.*?)```", README.read_text(), re.S)
SETUP = "git clone"  # the block that makes the checkout: what the test stands in for
S3_ENDPOINT, S3_BUCKET = "http://localhost:8333", "my-bucket"  # the S3 block's placeholders
# Blocks (by how they start) that cannot run here as written, and why (a server or a cluster this machine has not).
NOT_RUN = {
    SETUP: "it makes the checkout this test stands in for, and runs this suite",
    "filechannel tier rebuild --root /data/fc-new --tier s3://": "it needs an S3 bucket and a root whose metadata was lost",
    "# YARN: the driver": "it needs a YARN or Kubernetes cluster",
    "import json\nfrom filechannel.spark import uploaded_end_offsets": (
        "a part of the cluster job above: `spark` is the cluster's session, /data/fc the channel's root"
    ),
}


def _not_run(code: str) -> bool:
    return any(code.startswith(start) for start in NOT_RUN)


def _is_spark(code: str) -> bool:
    return "filechannel.spark" in code


def _shown(code: str) -> list[str]:
    """The ``#> TEXT`` lines of a block: what it shows its commands print."""
    return [line.removeprefix("#> ") for line in code.splitlines() if line.startswith("#> ")]


def _printed(shown: str, output: str) -> bool:
    """Whether a line of ``output`` is ``shown``, where ``...`` in it stands for anything."""
    pattern = ".*".join(re.escape(part) for part in shown.split("..."))
    return any(re.fullmatch(pattern, line) for line in output.splitlines())


def _run_readme(folder: Path, s3: SeaweedServer) -> list[str]:
    """Run the README's blocks in ``folder``, S3 on ``s3``; the first lines of those run, in order."""
    (folder / "examples").symlink_to(ROOT / "examples")
    (folder / ".venv").symlink_to(Path(sys.prefix))  # `.venv/bin/python`, as `make` makes it
    bindir = Path(sys.executable).parent
    env = {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "HOME": str(folder),
        # The checkout under test, not an installed copy, for every process (and Spark's workers).
        # Spark's Python workers import pyspark as installed, not from Spark's zip, which each of them
        # compiles again (README "Spark"): the blocks run as written, on half the workers' CPU time.
        "PYTHONPATH": jvm_archive.checkout_python_path(),
        **{k: v for k, v in os.environ.items() if k in ("JAVA_HOME", "JAVA_TOOL_OPTIONS", "SPARK_LOCAL_IP", "TMPDIR")},
        # S3's access key, as a user's shell has it (the S3 block's commands read it from there)
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
    }
    bucket = f"fc-readme-{uuid.uuid4().hex[:12]}"  # the session's server serves other tests too
    ran = []
    for lang, code in BLOCKS:
        if _not_run(code):
            continue
        code = code.replace(S3_ENDPOINT, s3.endpoint).replace(S3_BUCKET, bucket)
        argv = [sys.executable, "-c", code] if lang == "python" else ["bash", "-ec", code]
        proc = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=600, env=env)
        first = code.strip().splitlines()[0]
        assert proc.returncode == 0, f"README block {first!r} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        for shown in _shown(code):
            assert _printed(shown, proc.stdout + proc.stderr), (
                f"README block {first!r} did not print {shown!r}:\n{proc.stdout}\n{proc.stderr}"
            )
        ran.append(first)
    return ran


def test_the_s3_block_shows_what_it_prints():
    """The S3 block is there, uses the placeholders the test replaces, and shows its output."""
    (s3_block,) = [b for _, b in BLOCKS if "tier=s3://" in b and not _not_run(b)]
    assert S3_ENDPOINT in s3_block and f"s3://{S3_BUCKET}/" in s3_block and "AWS_SECRET" not in s3_block
    assert len(_shown(s3_block)) >= 6


@pytest.mark.spark
@pytest.mark.s3
@pytest.mark.slow
def test_the_readme_runs_top_to_bottom_in_one_folder(tmp_path, seaweed):
    """Every block, the Spark one included (one run: each block's processes cost seconds)."""
    ran = _run_readme(tmp_path, seaweed)
    assert len(ran) == len([b for _, b in BLOCKS if not _not_run(b)]) >= 10
    # What the blocks left behind is what they said: the topics of the Kafka-like examples.
    from filechannel.client import Admin

    admin = Admin(tmp_path / "data")
    assert {"clicks", "orders", "foobar", "my_topic"} <= set(admin.list_topics())

    def records(admin: Admin, topic: str) -> int:
        return sum(p.end_offset - p.first_offset for p in admin.describe_topic(topic).partitions)

    # The tiering block's records moved to tier-2 (`tier run --roll`): the root rebuilt from it alone has them.
    assert records(Admin(tmp_path / "data-rebuilt"), "pageviews") == 3
    # The S3 block's topic keeps the endpoint it was made with, and no credential, in its settings.
    settings = (tmp_path / "data" / "invoices" / "topic.json").read_text()
    assert seaweed.endpoint in settings and seaweed.access_key not in settings and seaweed.secret_key not in settings
    # The Spark stream copied every click, upper-cased, to clicks-upper.
    assert records(admin, "clicks-upper") == records(admin, "clicks") > 0


def test_the_spark_example_uses_real_options():
    spark_block = next(b for _, b in BLOCKS if _is_spark(b))
    from filechannel.spark.options import SINK_OPTIONS, SOURCE_OPTIONS

    for name in re.findall(r'\.option\("(\w+)"', spark_block):
        assert name.lower() in SOURCE_OPTIONS | SINK_OPTIONS, name
