"""Tier-2 object names and manifests: names round-trip and parse exactly, manifests refuse any damage."""

import json

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from filechannel.errors import ConfigError, CorruptRecordError, InvalidNameError
from filechannel.tiering.layout import (
    MAX_CHANNEL_CHARS,
    MAX_EPOCH,
    MAX_NAME_CHARS,
    MAX_OFFSET,
    ChunkRecord,
    ObjectName,
    SegmentRecord,
    chunk_name,
    decode_manifest,
    encode_manifest,
    manifest_name,
    parse_object_name,
    plan_chunks,
)

PART_CHARS = "abcXYZ019._-"
parts = st.text(PART_CHARS, min_size=1, max_size=12).filter(lambda p: p not in (".", ".."))
channels = st.lists(parts, min_size=1, max_size=3).map("/".join)
offsets = st.integers(0, MAX_OFFSET)
epochs = st.integers(1, MAX_EPOCH)


@st.composite
def segments(draw):
    channel, epoch = draw(channels), draw(epochs)
    base = draw(st.integers(0, MAX_OFFSET - 1))
    end = draw(st.integers(base + 1, MAX_OFFSET))
    size = draw(st.integers(1, 10_000))
    chunks = plan_chunks(channel, base, epoch, size, draw(st.integers(1, 4_000)))
    ts = draw(st.integers(-(2**63), 2**63 - 1))
    return SegmentRecord(channel, base, end, size, ts, "uploaded", epoch, chunks, manifest_name(channel, base, epoch))


@given(channels, offsets, epochs, offsets)
def test_chunk_names_parse_back_to_what_made_them(channel, base, epoch, start):
    name = chunk_name(channel, base, epoch, start)
    assert len(name) <= MAX_NAME_CHARS
    parsed = parse_object_name(name)
    assert parsed == ObjectName("chunk", channel, base, epoch, start)
    assert parsed.name == name


@given(channels, offsets, epochs)
def test_manifest_names_parse_back_to_what_made_them(channel, base, epoch):
    name = manifest_name(channel, base, epoch)
    parsed = parse_object_name(name)
    assert parsed == ObjectName("manifest", channel, base, epoch, None)
    assert parsed.name == name


@given(st.lists(offsets, min_size=2, max_size=10, unique=True), epochs)
def test_a_listing_sorted_by_name_is_sorted_by_base_offset(bases, epoch):
    names = [manifest_name("t/0", b, epoch) for b in bases]
    assert [p.base_offset for n in sorted(names) if (p := parse_object_name(n))] == sorted(bases)


@given(channels, offsets, epochs, offsets, st.data())
def test_a_near_miss_of_a_name_is_refused_or_is_itself_exactly_a_name(channel, base, epoch, start, data):
    """parse_object_name accepts a string only if chunk_name/manifest_name would produce exactly it."""
    name = data.draw(st.sampled_from([chunk_name(channel, base, epoch, start), manifest_name(channel, base, epoch)]))
    i = data.draw(st.integers(0, len(name)))
    c = data.draw(st.sampled_from("0123456789E./-_aZ\n\u0661 "))
    op = data.draw(st.sampled_from(["delete", "insert", "replace"]))
    mutated = {"delete": name[:i] + name[i + 1 :], "insert": name[:i] + c + name[i:], "replace": name[:i] + c + name[i + 1 :]}[op]
    parsed = parse_object_name(mutated)
    if mutated != name and parsed is not None:
        assert parsed.name == mutated
        assert parsed != parse_object_name(name)


GOOD_CHUNK = "t/0/00000000000000000007.E0000000003.00000000000000000100.chunk"


@pytest.mark.parametrize(
    "name",
    [
        "",
        "00000000000000000007.E0000000003.manifest",  # no channel
        "/00000000000000000007.E0000000003.manifest",  # empty channel part
        "t//0/00000000000000000007.E0000000003.manifest",
        "../00000000000000000007.E0000000003.manifest",
        "t/./00000000000000000007.E0000000003.manifest",
        "t/0/0000000000000000007.E0000000003.manifest",  # 19 digits
        "t/0/000000000000000000007.E0000000003.manifest",  # 21 digits
        "t/0/00000000000000000007.E000000003.manifest",
        "t/0/00000000000000000007.e0000000003.manifest",
        "t/0/00000000000000000007.E0000000000.manifest",  # epoch 0 is never taken
        "t/0/99999999999999999999.E0000000003.manifest",  # past the largest offset
        "t/0/00000000000000000007.E0000000003.manifest\n",
        "t/0/00000000000000000007.E0000000003.Manifest",
        "t/0/00000000000000000007.E0000000003.00000000000000000100.manifest",
        "t/0/00000000000000000007.E0000000003.chunk",
        "t/0/0000000000000000000\u0667.E0000000003.manifest",  # a non-ASCII digit
        "t 0/00000000000000000007.E0000000003.manifest",
        GOOD_CHUNK + ".tmp",
        GOOD_CHUNK.replace(".chunk", ".chunks"),
        GOOD_CHUNK.replace("00000000000000000100", "99999999999999999999"),
    ],
)
def test_names_that_no_function_makes_are_not_parsed(name):
    assert parse_object_name(name) is None


def test_a_channel_part_that_looks_like_an_object_name_stays_part_of_the_channel():
    channel = "t/00000000000000000001.E0000000001.manifest"
    name = manifest_name(channel, 5, 2)
    assert parse_object_name(name) == ObjectName("manifest", channel, 5, 2, None)


@pytest.mark.parametrize("channel", ["", "a//b", "/a", "a/", "..", "a/../b", "a b", "ü", "a\\b", 7, None, "x" * 201])
def test_bad_channels_are_refused_with_invalid_name_error(channel):
    with pytest.raises(InvalidNameError, match="channel"):
        chunk_name(channel, 0, 1, 0)
    with pytest.raises(InvalidNameError, match="channel"):
        manifest_name(channel, 0, 1)


def test_the_longest_channel_still_makes_names_within_the_storage_limit():
    channel = "/".join(["c" * 200] * 5)[:MAX_CHANNEL_CHARS]
    assert len(chunk_name(channel, MAX_OFFSET, MAX_EPOCH, MAX_OFFSET)) == MAX_NAME_CHARS
    with pytest.raises(InvalidNameError, match="longer than"):
        manifest_name(channel + "c", 0, 1)


@pytest.mark.parametrize(
    ("base", "epoch", "start"),
    [(-1, 1, 0), (MAX_OFFSET + 1, 1, 0), (0, 0, 0), (0, MAX_EPOCH + 1, 0), (0, 1, -1), (True, 1, 0), (0, 1, 1.0), ("0", 1, 0)],
)
def test_numbers_out_of_range_or_of_the_wrong_type_are_refused(base, epoch, start):
    with pytest.raises(ConfigError):
        chunk_name("t/0", base, epoch, start)


@given(channels, offsets, epochs, st.integers(1, 10_000), st.integers(1, 3_000))
def test_planned_chunks_cover_the_segment_in_order(channel, base, epoch, size, chunk_bytes):
    chunks = plan_chunks(channel, base, epoch, size, chunk_bytes)
    assert [c.position for c in chunks] == list(range(0, size, chunk_bytes))
    assert sum(c.length for c in chunks) == size
    assert all(0 < c.length <= chunk_bytes for c in chunks)
    assert all(parse_object_name(c.name) == ("chunk", channel, base, epoch, c.position) for c in chunks)


@given(segments())
def test_manifests_round_trip(segment):
    assert decode_manifest(encode_manifest(segment), segment.manifest) == segment


@given(segments(), st.data())
def test_any_single_changed_byte_of_a_manifest_is_refused(segment, data):
    encoded = encode_manifest(segment)
    i = data.draw(st.integers(0, len(encoded) - 1))
    byte = data.draw(st.integers(0, 255).filter(lambda b: b != encoded[i]))
    damaged = encoded[:i] + bytes([byte]) + encoded[i + 1 :]
    with pytest.raises(CorruptRecordError, match="manifest 't/0/"):
        decode_manifest(damaged, "t/0/00000000000000000000.E0000000001.manifest")


def small_segment():
    chunks = plan_chunks("t/0", 0, 1, 100, 40)
    return SegmentRecord("t/0", 0, 10, 100, 123, "uploaded", 1, chunks, manifest_name("t/0", 0, 1))


def test_every_single_bit_flip_of_a_manifest_is_refused():
    segment = small_segment()
    encoded = encode_manifest(segment)
    for i in range(len(encoded)):
        for bit in range(8):
            damaged = encoded[:i] + bytes([encoded[i] ^ (1 << bit)]) + encoded[i + 1 :]
            with pytest.raises(CorruptRecordError):
                decode_manifest(damaged, segment.manifest)


def test_truncated_manifests_are_refused():
    segment = small_segment()
    encoded = encode_manifest(segment)
    for n in range(len(encoded)):
        with pytest.raises(CorruptRecordError):
            decode_manifest(encoded[:n], segment.manifest)


def with_crc(body: dict, version=1) -> bytes:
    """A manifest around ``body`` with a correct CRC, so that the check under test is the one that fires."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return b'{"crc32c":%d,"segment":%s,"version":%s}' % (crc32c(canonical), canonical, json.dumps(version).encode())


def body_of(segment):
    return json.loads(encode_manifest(segment))["segment"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b.pop("size"), "fields"),
        (lambda b: b.update(extra=1), "fields"),
        (lambda b: b.update(size="100"), "'size' is not a int"),
        (lambda b: b.update(size=100.0), "'size' is not a int"),
        (lambda b: b.update(epoch=True), "'epoch' is not a int"),
        (lambda b: b.update(chunks={}), "'chunks' is not a list"),
        (lambda b: b["chunks"][0].pop("name"), "chunk 0 has fields"),
        (lambda b: b["chunks"][1].update(length=-5), "length"),
        (lambda b: b["chunks"].pop(), "cover"),
        (lambda b: b.update(size=101), "cover"),
        (lambda b: b.update(end_offset=0), "at least one record"),
        (lambda b: b["chunks"][0].update(name="t/0/x.chunk"), "is named"),
        (lambda b: b.update(channel="t/../x"), "channel"),
    ],
)
def test_manifests_with_a_good_crc_but_a_bad_record_are_refused(change, message):
    segment = small_segment()
    body = body_of(segment)
    change(body)
    with pytest.raises(CorruptRecordError, match=message) as err:
        decode_manifest(with_crc(body), segment.manifest)
    assert segment.manifest in str(err.value)


@pytest.mark.parametrize("version", [0, 3, "1", "2", True, None])
def test_unknown_manifest_versions_are_refused(version):
    segment = small_segment()
    with pytest.raises(CorruptRecordError, match="unknown manifest version"):
        decode_manifest(with_crc(body_of(segment), version), segment.manifest)


def test_a_manifest_under_another_segments_name_is_refused():
    segment = small_segment()
    with pytest.raises(CorruptRecordError, match="describes the segment whose manifest is"):
        decode_manifest(encode_manifest(segment), manifest_name("t/0", 0, 2))


def test_a_manifest_not_in_canonical_form_is_refused():
    segment = small_segment()
    spaced = encode_manifest(segment).replace(b'"version":1', b'"version": 1')
    with pytest.raises(CorruptRecordError, match="canonical"):
        decode_manifest(spaced, segment.manifest)


@pytest.mark.parametrize(
    "change",
    [
        lambda s: {"chunks": s.chunks[:-1]},
        lambda s: {"chunks": (ChunkRecord(s.chunks[0].name, 1, 40), *s.chunks[1:])},
        lambda s: {"chunks": list(s.chunks)},
        lambda s: {"end_offset": s.base_offset},
        lambda s: {"manifest": "t/0/other.manifest"},
        lambda s: {"state": "gone"},
    ],
)
def test_encoding_a_record_that_breaks_an_invariant_is_refused(change):
    segment = small_segment()
    with pytest.raises(ConfigError, match="cannot write a manifest"):
        encode_manifest(SegmentRecord(**{**segment.__dict__, **change(segment)}))
