"""The on-disk cache of tier-2 blocks (``tier_cache_dir``): bounded, private to its process,
removed on close and after a crash, and transparent to readers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filechannel import ConfigError, FileChannel
from filechannel.tiering.block_cache import DiskBlockCache

from .read_helpers import offload, read_all, tier_of


def on_disk(cache: DiskBlockCache) -> int:
    return sum(os.path.getsize(os.path.join(cache.folder, f)) for f in os.listdir(cache.folder))


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 700)), max_size=60), capacity=st.integers(1, 2000))
def test_the_disk_cache_keeps_its_bound_and_returns_what_was_put(tmp_path_factory, ops, capacity) -> None:
    """A model check: the bytes in files never exceed the capacity, equal the cache's own
    count, and a hit returns exactly the bytes last put under that key."""
    cache = DiskBlockCache(capacity, str(tmp_path_factory.mktemp("cache")))
    last: dict[int, bytes] = {}
    try:
        for key, size in ops:
            data = bytes([key]) * size
            cache.put(key, data)
            if size <= capacity:
                last[key] = data
            assert on_disk(cache) == cache.nbytes <= capacity
            got = cache.get(key)
            assert got is None or got == last.get(key)
        for key, data in last.items():
            got = cache.get(key)
            assert got is None or got == data
        assert cache.peak_bytes <= capacity
    finally:
        cache.clear()
    assert not os.path.exists(cache.folder)


def test_a_cache_folder_left_by_a_killed_process_is_removed_by_the_next_cache(tmp_path) -> None:
    code = textwrap.dedent(
        f"""
        import sys, time
        from filechannel.tiering.block_cache import DiskBlockCache
        cache = DiskBlockCache(1 << 20, {str(tmp_path)!r})
        cache.put("k", b"x" * 1000)
        print(cache.folder, flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        folder = proc.stdout.readline().strip()
        assert os.path.isdir(folder) and os.listdir(folder)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert os.path.isdir(folder)  # the killed process could not clean up
    live = DiskBlockCache(1 << 20, str(tmp_path))
    try:
        assert not os.path.exists(folder)
        assert os.listdir(tmp_path) == [os.path.basename(live.folder)]
    finally:
        live.clear()


def test_a_tiered_channel_reads_through_the_disk_cache_and_removes_it_on_close(tmp_path) -> None:
    cache_dir = tmp_path / "cache"
    config = dict(
        segment_bytes=8192,
        compression_block_bytes=1024,
        maintenance_interval=0,
        tier=(tmp_path / "tier2").as_uri(),
        tier_cache_bytes=16 * 1024,
        tier_cache_dir=str(cache_dir),
    )
    values = [f"record-{i:06d}".encode() * 4 for i in range(3000)]
    with FileChannel(str(tmp_path / "ch"), **config) as ch:
        with ch.sender() as tx:
            for v in values:  # one by one: a batch stays in one segment
                tx.send(v)
            tx.flush()
        ch.compress_sealed()
        assert len(offload(ch, keep_local=1)) >= 5
        got = read_all(ch.receiver("earliest"), len(values))
        assert [r.value for r in got] == values
        cache = tier_of(ch).reader.cache
        assert isinstance(cache, DiskBlockCache) and os.path.dirname(cache.folder) == str(cache_dir)
        assert 0 < cache.peak_bytes <= 16 * 1024 and on_disk(cache) == cache.nbytes
        again = read_all(ch.receiver("earliest"), len(values))  # served by the cache or fetched again: the same
        assert [r.value for r in again] == values
    assert os.listdir(cache_dir) == []


@pytest.mark.parametrize("bad", ["", "   ", 3, b"/tmp"])
def test_a_bad_tier_cache_dir_is_refused(tmp_path, bad) -> None:
    with pytest.raises(ConfigError, match="tier_cache_dir"):
        FileChannel(str(tmp_path / "ch"), tier=(tmp_path / "t").as_uri(), tier_cache_dir=bad)
