"""Takes and drops one lock file of a channel on command: python writer_lock_holder.py FILE

Reads commands from stdin, one a line, and answers each on stdout:
"try" -> "True"/"False" (a non-blocking acquire), "take" -> "took" (a blocking acquire),
"drop" -> "dropped". Exits at the end of its input.
"""

import sys

from filechannel.engine.lock import FileLock

lock = FileLock(sys.argv[1])
for line in sys.stdin:
    command = line.strip()
    if command == "try":
        print(lock.acquire(blocking=False), flush=True)
    elif command == "take":
        lock.acquire()
        print("took", flush=True)
    elif command == "drop":
        lock.release()
        print("dropped", flush=True)
lock.close()
