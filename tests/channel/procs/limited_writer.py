"""Sends until the file-size limit stops it: python limited_writer.py PATH LIMIT_BYTES [PAD [FLUSH_EVERY]]

RLIMIT_FSIZE makes write() fail with EFBIG (Python ignores SIGXFSZ): a real OS error on
the write path, like a full disk. Each record is "record-NNNNNN" and PAD dots (default
200; records over a KiB are written with writev, smaller ones joined), flushed every
FLUSH_EVERY records (default 10; 0: never, so full buffers are written behind by the
appender's writer thread). Prints the last offset whose flush succeeded, then what the
failure and the next send raised.
"""

import resource
import sys

from filechannel import FileChannel, FileChannelError

path, limit = sys.argv[1], int(sys.argv[2])
pad = int(sys.argv[3]) if len(sys.argv) > 3 else 200
flush_every = int(sys.argv[4]) if len(sys.argv) > 4 else 10
# Without flushes, no flusher drains either: every write is a full buffer's, written behind.
with FileChannel(path, fsync="never", maintenance_interval=0, flush_interval=3600 if flush_every == 0 else 0.0005) as ch:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    sender = ch.sender()
    good = -1
    try:
        for i in range(1_000_000):
            off = sender.send(b"record-%06d" % i + b"." * pad)
            if flush_every and i % flush_every == flush_every - 1:
                sender.flush()
                good = off
    except FileChannelError as exc:
        print("failed", type(exc).__name__, exc, flush=True)
    print("good", good, flush=True)
    try:
        sender.send(b"after")
    except FileChannelError as exc:
        print("then", type(exc).__name__, flush=True)
