"""Opens a channel, sends one record and flushes it: python writer_send.py PATH VALUE

Prints the record's offset. Used to show that another process can write to a channel
(the parent times it out if it blocks on writer.lock).
"""

import sys

from filechannel import FileChannel

path, value = sys.argv[1], sys.argv[2].encode()
with FileChannel(path, maintenance_interval=0) as ch:
    sender = ch.sender()
    offset = sender.send(value)
    sender.flush()
print(offset, flush=True)
