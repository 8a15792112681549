"""`filechannel repair PATH --after OFFSET`, run through the console script's entry point (tests/cli_helpers.py)."""

import os

from filechannel import FileChannel
from filechannel.errors import LogCorruptedError

from ..cli_helpers import invoke as fc


def damaged_channel(path):
    """100 acknowledged records; the CRC of record 50 flipped: damage, not a torn tail."""
    with FileChannel(path, fsync="always", maintenance_interval=0) as ch:
        s = ch.sender()
        for i in range(100):
            s.send(b"value-%03d" % i)
    seg = path / sorted(f for f in os.listdir(path) if f.endswith(".seg"))[-1]
    data = bytearray(seg.read_bytes())
    pos = 32 + 50 * (8 + 9 + 9)
    data[pos + 4] ^= 0x01
    seg.write_bytes(bytes(data))
    return seg


def test_repair_cuts_after_the_offset_the_operator_gives_and_sends_go_on(tmp_path):
    path = tmp_path / "ch"
    damaged_channel(path)
    with FileChannel(path, maintenance_interval=0) as ch:
        try:
            ch.sender().send(b"x")
        except LogCorruptedError as exc:
            assert f"filechannel repair {path} --after 49" in str(exc)
        else:
            raise AssertionError("a send after damage in the middle of the log must be refused")
    refused = fc("repair", str(path), "--after", "49", input=b"n\n")
    assert refused.returncode != 0 and b"Traceback" not in refused.stderr
    done = fc("repair", str(path), "--after", "49", "--yes")
    assert done.returncode == 0, done.stderr.decode()
    assert "sends go on from 50" in done.stdout.decode()
    with FileChannel(path, maintenance_interval=0) as ch:
        s = ch.sender()
        assert s.send(b"next") == 50
        s.flush()
        got = ch.receiver().recv_many(1000, timeout=0)
        assert [r.value for r in got] == [b"value-%03d" % i for i in range(50)] + [b"next"]


def test_repair_errors_are_one_line(tmp_path):
    path = tmp_path / "ch"
    damaged_channel(path)
    past = fc("repair", str(path), "--after", "70", "--yes")
    assert past.returncode == 1 and b"Traceback" not in past.stderr
    assert b"choose an offset below 50" in past.stderr
    missing = fc("repair", str(tmp_path / "nothing"), "--after", "3", "--yes")
    assert missing.returncode == 1 and b"not a channel folder" in missing.stderr
    assert not (tmp_path / "nothing").exists()
