"""The compressed-read bound the bench reports: what it adds up, on a real channel."""

import glob
import os

from filechannel import FileChannel
from filechannel.bench.cpu_bound import compressed_read_floor_s
from filechannel.engine.compressed import CompressedSegment


def test_the_floor_is_the_busier_of_the_reader_and_all_cpus_together(tmp_path):
    values = [b'{"user": "u-%05d", "views": [1, 2, 3]}' % i * 8 for i in range(3000)]
    with FileChannel(tmp_path, segment_bytes=128 * 1024, compression_block_bytes=16 * 1024, maintenance_interval=0) as ch:
        s = ch.sender()
        for i in range(0, len(values), 50):  # a batch stays in one segment: small ones roll
            s.send_many(values[i : i + 50])
        s.flush()
        assert ch.compress_sealed()
    got = compressed_read_floor_s(str(tmp_path), 100, 2)
    assert got is not None
    raw = 0
    for path in glob.glob(os.path.join(tmp_path, "*.seg.z")):
        seg = CompressedSegment.open(path)
        raw += sum(b.raw_length for b in seg.info.blocks)
        seg.close()
    assert got["raw_bytes"] == raw
    assert got["decompress_s"] > 0 and got["decode_s"] > 0
    assert got["floor_s"] == max(got["decode_s"], (got["decompress_s"] + got["decode_s"]) / got["cpus"])


def test_no_compressed_segments_no_floor(tmp_path):
    with FileChannel(tmp_path, maintenance_interval=0) as ch:
        ch.sender().send(b"x")
    assert compressed_read_floor_s(str(tmp_path), 100, 1) is None
