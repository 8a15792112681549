"""A writer whose roll fails for real, then stays alive: python writer_roll_fails.py PATH

Fills the active segment (segment_bytes=4096: one record of 4 KiB, so the next send
rolls), then lowers RLIMIT_NOFILE below the next
free descriptor, so creating the next segment fails with EMFILE in the send that rolls.
Prints "failed <error type>", then waits for a line on stdin (the parent meanwhile has
another process write to the channel), restores the limit, sends "after" and prints its
offset.
"""

import os
import resource
import sys

from filechannel import FileChannel, FileChannelError

path = sys.argv[1]
with FileChannel(path, segment_bytes=4096, maintenance_interval=0, compression="none") as ch:
    sender = ch.sender()
    sender.send(b"f" * 4096)
    sender.flush()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    probe = os.open(os.devnull, os.O_RDONLY)  # the lowest free descriptor
    os.close(probe)
    resource.setrlimit(resource.RLIMIT_NOFILE, (probe, hard))
    try:
        sender.send(b"rolls")
        print("sent", flush=True)
    except FileChannelError as exc:
        print("failed", type(exc).__name__, flush=True)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    sys.stdin.readline()
    offset = sender.send(b"after")
    sender.flush()
print(offset, flush=True)
