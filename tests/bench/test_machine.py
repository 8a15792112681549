"""The machine's figures the bench reports beside its rows (filechannel/bench/machine.py)."""

import time

from filechannel.bench.machine import busy_cpu_seconds


def test_busy_cpu_seconds_grow_while_this_process_works():
    before = busy_cpu_seconds()
    assert before is not None and before > 0  # Linux: /proc/stat is there
    end = time.process_time() + 0.2
    while time.process_time() < end:  # 0.2 s of this process's CPU, counted in the machine's
        pass
    after = busy_cpu_seconds()
    assert after is not None and after >= before + 0.1
