"""Running the installed console script in a real subprocess, as a user does."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(sys.executable).parent / "filechannel"


def fc(root, *args, input=None, check=True):
    """``filechannel ARGS`` with ``FILECHANNEL_ROOT=root``; raises with its stderr if ``check`` and it failed."""
    env = {**os.environ, "FILECHANNEL_ROOT": str(root)}
    proc = subprocess.run([str(SCRIPT), *args], input=input, capture_output=True, env=env, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"filechannel {' '.join(args)} failed: {proc.stderr.decode()}")
    return proc
