"""The command line as a user in a terminal or a pipeline meets it (issue 23), each through the
installed console script in a real subprocess."""

import os
import subprocess

from .cli_helpers import SCRIPT, fc


def _env(root):
    return {**os.environ, "FILECHANNEL_ROOT": str(root)}


def _closed_stdout(root, *args):
    """Run ``filechannel ARGS`` with a stdout whose reader is already gone; its exit code and stderr."""
    proc = subprocess.Popen([str(SCRIPT), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(root))
    proc.stdout.close()
    try:
        err = proc.stderr.read().decode()
        return proc.wait(timeout=60), err
    finally:
        proc.stderr.close()


# -- a closed pipe ----------------------------------------------------------------------------


def test_a_closed_stdout_ends_every_command_with_exit_0_and_nothing_on_stderr(tmp_path):
    fc(tmp_path, "topics", "create", "t", "--partitions", "2")
    fc(tmp_path, "produce", "t", input=b"".join(b"line %d\n" % i for i in range(2000)))
    for args in (
        ["topics", "list"],
        ["topics", "describe", "t"],
        ["consume", "t", "--from-beginning", "--no-follow"],
        ["consume", "t", "--from-beginning", "--no-follow", "--format", "json"],
        ["check"],
    ):
        code, err = _closed_stdout(tmp_path, *args)
        assert (code, err) == (0, ""), (args, code, err)


def test_consume_follow_into_head_ends_when_head_exits_and_commits_only_what_was_written(tmp_path):
    fc(tmp_path, "produce", "t", input=b"a\nb\nc\n")
    script = f"'{SCRIPT}' consume t --group g --from-beginning | head -1; echo \"status=${{PIPESTATUS[0]}}\" >&2"
    # --follow waits for records that never come: it must notice that head is gone, not wait for ever
    proc = subprocess.run(["bash", "-c", script], capture_output=True, env=_env(tmp_path), timeout=60)
    assert proc.stdout == b"a\n"
    assert proc.stderr.decode() == "status=0\n"
    rest = fc(tmp_path, "consume", "t", "--group", "g", "--from-beginning", "--no-follow").stdout.decode().split()
    # what reached the pipe before head closed it is committed, nothing after: the rest comes again
    assert 1 <= 3 - len(rest) <= 3 and rest == ["a", "b", "c"][3 - len(rest) :]
