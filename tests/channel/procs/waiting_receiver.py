"""Blocks in recv until COUNT records arrived, then prints them: python waiting_receiver.py PATH COUNT"""

import sys
import time

from filechannel import FileChannel

path, count = sys.argv[1], int(sys.argv[2])
with FileChannel(path) as ch:
    rx = ch.receiver("earliest")
    print("ready", flush=True)
    for _ in range(count):
        rec = rx.recv(timeout=60)
        assert rec.value is not None
        print(rec.offset, rec.value.decode(), time.time() * 1000 - rec.timestamp, flush=True)
