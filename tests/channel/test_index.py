"""Index entries packed in bulk are the entries, one by one, that the readers unpack."""

from hypothesis import given
from hypothesis import strategies as st

from filechannel.engine.index import MIN_TIMESTAMP, IndexMark, encode_marks
from filechannel.engine.record import OFFSET_ENTRY, TIME_ENTRY

marks_st = st.lists(
    st.builds(
        IndexMark,
        st.integers(1000, 1000 + 2**32 - 1),
        st.integers(0, 2**32 - 1),
        st.integers(MIN_TIMESTAMP, 2**63 - 1),
    ),
    max_size=50,
)


@given(marks=marks_st)
def test_encode_marks_packs_each_entry(marks):
    idx, tix = encode_marks(1000, marks)
    assert list(OFFSET_ENTRY.iter_unpack(idx)) == [(m.offset - 1000, m.position) for m in marks]
    assert list(TIME_ENTRY.iter_unpack(tix)) == [(m.max_timestamp_before, m.offset - 1000) for m in marks]
