"""Appends records tagged with a name: python appender.py PATH TAG COUNT [delay_s]"""

import sys
import time

from filechannel import FileChannel

path, tag, count = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
delay = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
with FileChannel(path, fsync="never") as ch:
    sender = ch.sender()
    i = 0
    while i < count:
        if i % 10 == 0 and count - i >= 5:
            sender.send_many([b"%s-%d" % (tag, i + k) for k in range(5)])
            i += 5
        else:
            sender.send(b"%s-%d" % (tag, i), timestamp=int(time.time() * 1000))
            i += 1
        if delay:
            sender.flush()
            time.sleep(delay)
