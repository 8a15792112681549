"""The child processes of test_metadata.py: ``python metadata_procs.py NAME ARGS`` runs one of the
functions below. Kept apart from the tests so that a child imports only the metadata store (pytest and
hypothesis cost a child about half a second of CPU each, over forty children a run)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from filechannel.bench.seaweed import wait_for
from filechannel.errors import FencedError
from filechannel.tiering.layout import STATES, manifest_name, plan_chunks
from filechannel.tiering.metadata import TierMetadata


def _take_epochs(path, go, n):
    with TierMetadata(path) as m:
        wait_for(lambda: os.path.exists(go), 30, "the go file")
        for _ in range(int(n)):
            print(m.take_epoch(f"pid {os.getpid()}"), flush=True)


def _paused_uploader(path):
    with TierMetadata(path) as m:
        epoch = m.take_epoch(f"paused {os.getpid()}")
        chunks = plan_chunks("t/0", 0, epoch, 100, 30)
        m.begin_upload(epoch, "t/0", 0, 10, 100, 0, chunks)
        print("ready", epoch, flush=True)
        assert sys.stdin.readline() == "commit\n"
        try:
            m.finish_upload(epoch, "t/0", 0, chunks, manifest_name("t/0", 0, epoch))
        except FencedError as exc:
            print("fenced", exc, flush=True)
        else:
            print("committed", flush=True)


def _stream(path):
    """An uploader's life: clean up after the previous one, then upload and delete segments forever."""
    with TierMetadata(path) as m:
        epoch = m.take_epoch(f"stream {os.getpid()}")
        print("epoch", epoch, flush=True)
        for stale in m.stale_uploads(epoch):
            m.abandon_upload(epoch, stale.channel, stale.base_offset)
            print("abandoned", stale.base_offset, flush=True)
        for seg in m.segments("t/0", ["deleting"]):
            m.finish_delete(epoch, "t/0", seg.base_offset)
            print("deleted", seg.base_offset, flush=True)
        uploaded = [s.base_offset for s in m.segments("t/0")]
        base = max([s.end_offset for s in m.segments("t/0", STATES)], default=0)
        while True:
            chunks = plan_chunks("t/0", base, epoch, 1000 + base, 64)
            m.begin_upload(epoch, "t/0", base, base + 10, 1000 + base, base, chunks)
            print("uploading", base, flush=True)
            m.finish_upload(epoch, "t/0", base, chunks, manifest_name("t/0", base, epoch))
            print("uploaded", base, flush=True)
            uploaded.append(base)
            if len(uploaded) > 3:
                oldest = uploaded.pop(0)
                m.begin_delete(epoch, "t/0", oldest)
                print("deleting", oldest, flush=True)
                m.finish_delete(epoch, "t/0", oldest)
                print("deleted", oldest, flush=True)
            base += 10


def _open_and_take_epoch(path, go):
    wait_for(lambda: os.path.exists(go), 30, "the go file")
    try:
        with TierMetadata(path) as m:
            print("ok", m.take_epoch("racer"), flush=True)
    except Exception as exc:  # reported to the parent, which asserts on it
        print("error", repr(exc), flush=True)


if __name__ == "__main__":
    mains: dict[str, Callable[..., object]] = {
        "take_epochs": _take_epochs,
        "paused_uploader": _paused_uploader,
        "stream": _stream,
        "open_and_take_epoch": _open_and_take_epoch,
    }
    mains[sys.argv[1]](*sys.argv[2:])
