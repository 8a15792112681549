"""The crash tests' children (tests/children.py) are real processes, run as a new interpreter would run them."""

import os
import signal

from . import children


def test_a_child_runs_its_script_as_main_with_its_arguments_environment_folder_and_exit_code(tmp_path, monkeypatch):
    script = tmp_path / "script.py"
    script.write_text(
        "import os, sys\n"
        "print(__name__, sys.argv[1:], os.getcwd(), os.environ.get('FC_CHILD'), sys.path[0], os.getpid())\n"
        "print('to stderr', file=sys.stderr)\n"
        "sys.exit(int(sys.argv[1]))\n"
    )
    monkeypatch.chdir(tmp_path)
    child = children.start(script, "3", stderr=True, env={**os.environ, "FC_CHILD": "x"})
    out, err = child.communicate(timeout=60)
    assert out == f"__main__ ['3'] {tmp_path} x {tmp_path} {child.pid}\n"  # the pid signals go to
    assert err == "to stderr\n"
    assert child.returncode == 3


def test_sigkill_ends_a_child_with_minus_9_and_a_dead_child_is_never_signalled_again(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import signal\nprint('up', flush=True)\nsignal.pause()\n")  # until killed
    child = children.start(script, text=False)
    assert child.stdout is not None and child.stderr is None
    assert child.stdout.readline() == b"up\n"
    assert child.poll() is None
    child.kill()
    assert child.wait(timeout=30) == -signal.SIGKILL
    assert child.stdout.read() == b""
    child.stdout.close()
    child.send_signal(signal.SIGKILL)  # nothing: its pid may be another process's by now
    assert child.poll() == -signal.SIGKILL


def test_a_child_whose_script_raises_exits_1_with_the_traceback_on_stderr(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("raise ValueError('bad input')\n")
    child = children.start(script, stdout=False, stderr=True)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 1
    assert "ValueError: bad input" in err
