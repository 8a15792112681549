/* The channel's per-record hot paths in C: frame heads and index entries of a send_many
 * batch, decoding frames of key-less, header-less records (filechannel/engine/record.py holds
 * the pure-Python reference of both), walking and checking the frames of a segment
 * (segment.scan_frames_py is its reference), and the common case of a single send (AppendCore,
 * below; appender.Appender._append is its Python reference). Python uses this module only
 * when it imports; the tests check that the C and Python versions agree byte for byte.
 *
 * CRC-32C here is the SSE4.2 instruction, so the module refuses to load (ImportError,
 * and record.py falls back) on a CPU or compiler without it. A frame is
 * [u32 length][u32 CRC-32C of payload][payload], the payload of a plain record is
 * [u8 attributes = 0][i64 timestamp][value], all little-endian (x86-64 is).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>
#include <errno.h>
#include <sched.h>
#include <sys/uio.h>
#include <unistd.h>
#include <pthread.h>
#include <time.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FC_HAVE_SSE42 1
#else
#define FC_HAVE_SSE42 0
#endif

#define FRAME_HEADER 8
#define PREFIX 9
#define HEAD (FRAME_HEADER + PREFIX)
#define FUSED_COPY_MIN 1024 /* a value at least this long is copied and CRC-checked in one pass */

#if FC_HAVE_SSE42
/* The CRC state runs one crc32 instruction per 8 bytes, each waiting for the last (3
 * cycles), while the CPU can start one per cycle. So a long buffer is taken in rounds of
 * three STRIDE-byte blocks run side by side, the first continuing the state and the other
 * two from state 0, and joined by linearity: state' = shift(2 STRIDE, x0) ^ shift(STRIDE,
 * x1) ^ x2, where shift(n, s) is the state s after n zero bytes (a linear map on 32 bits,
 * tabulated per byte of s at module init). At 1 KiB this takes about half the time. */
#define STRIDE 336
static uint32_t shift1[4][256], shift2[4][256];

__attribute__((target("sse4.2"))) static uint64_t
crc_serial(uint64_t c, const unsigned char *p, size_t n)
{
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) {
        c32 = __builtin_ia32_crc32qi(c32, *p++);
    }
    return c32;
}

static uint32_t
shift(uint32_t table[4][256], uint32_t s)
{
    return table[0][s & 0xff] ^ table[1][(s >> 8) & 0xff] ^ table[2][(s >> 16) & 0xff] ^ table[3][s >> 24];
}

static void
init_shift(uint32_t table[4][256], size_t zeros)
{
    static const unsigned char zero[2 * STRIDE];
    uint32_t bit[32];
    for (int i = 0; i < 32; i++) {
        bit[i] = (uint32_t)crc_serial((uint64_t)1 << i, zero, zeros);
    }
    for (int k = 0; k < 4; k++) {
        for (int b = 0; b < 256; b++) {
            uint32_t v = 0;
            for (int i = 0; i < 8; i++) {
                if (b & (1 << i)) {
                    v ^= bit[8 * k + i];
                }
            }
            table[k][b] = v;
        }
    }
}

/* A long buffer goes faster by folding (Intel's "Fast CRC Computation for Generic Polynomials
 * Using PCLMULQDQ"): sixteen 128-bit lanes of state, four 512-bit registers, each lane carried
 * 2048 bits forward per round by two carry-less multiplies with x^(2048+31) and x^(2048-33)
 * mod P (bit-reflected, as CRC-32C is), XORed into the data there. The state's polynomial
 * stays congruent mod P to the bytes it replaced, so the four registers, folded into one by
 * 512-bit steps, give the buffer's CRC when the crc32 instruction runs over their 64 bytes
 * from state 0 (the initial state is XORed into the first four bytes). It halves the time
 * of a long value against the streams below; at 256 bytes it gained nothing, hence FOLD_MIN
 * (the figures: DESIGN.md, "Frame"). Needs AVX-512F and VPCLMULQDQ (checked at module
 * init: fold_ok); the constants are x^e mod P for the e above, bit-reversed.
 * tests/channel/test_codec.py checks both ways against the crc32c package (set_fold). */
#define FOLD_MIN 512   /* bytes from which a buffer is folded */
#define FOLD_ROUND 256 /* bytes a round folds */
static int fold_ok, fold_supported;

#define FOLD_KEYS(lo, hi) _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo)

__attribute__((target("avx512f,vpclmulqdq,sse4.2"), noinline)) static uint64_t
crc_fold(uint64_t state, const unsigned char *p, size_t n, unsigned char *dst)
{
    const __m512i k2048 = FOLD_KEYS(0xdcb17aa4, 0xb9e02b86), k512 = FOLD_KEYS(0x740eef02, 0x9e4addf8);
    __m512i z[4];
    for (int j = 0; j < 4; j++) {
        z[j] = _mm512_loadu_si512((const void *)(p + 64 * j));
        if (dst != NULL) {
            _mm512_storeu_si512((void *)(dst + 64 * j), z[j]);
        }
    }
    z[0] = _mm512_xor_si512(z[0], _mm512_castsi128_si512(_mm_cvtsi32_si128((int)(uint32_t)state)));
    for (size_t off = FOLD_ROUND; off < n; off += FOLD_ROUND) {
        for (int j = 0; j < 4; j++) {
            __m512i b = _mm512_loadu_si512((const void *)(p + off + 64 * j));
            if (dst != NULL) {
                _mm512_storeu_si512((void *)(dst + off + 64 * j), b);
            }
            z[j] = _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(z[j], k2048, 0x00),
                                             _mm512_clmulepi64_epi128(z[j], k2048, 0x11), b, 0x96);
        }
    }
    for (int j = 1; j < 4; j++) {
        z[0] = _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(z[0], k512, 0x00),
                                         _mm512_clmulepi64_epi128(z[0], k512, 0x11), z[j], 0x96);
    }
    unsigned char last[64];
    _mm512_storeu_si512((void *)last, z[0]);
    return crc_serial(0, last, 64);
}

/* crc32c(data, previous) of the crc32c package: continuing `previous` over `data`; with
 * dst, data is copied there in the same pass (a value's bytes while its CRC is checked:
 * one read of it, not two). Inlined into both callers, so the CRC-only one has no stores. */
__attribute__((target("sse4.2"), always_inline)) static inline uint32_t
crc32c_pass(uint32_t previous, const unsigned char *p, size_t n, unsigned char *dst)
{
    uint64_t c = (uint32_t)~previous;
    if (n >= FOLD_MIN && fold_ok) {
        size_t bulk = n - n % FOLD_ROUND;
        c = crc_fold(c, p, bulk, dst);
        p += bulk;
        n -= bulk;
        if (dst != NULL) {
            dst += bulk;
        }
    }
    while (n >= 3 * STRIDE) {
        uint64_t c1 = 0, c2 = 0;
        for (size_t i = 0; i < STRIDE; i += 8) {
            uint64_t v0, v1, v2;
            memcpy(&v0, p + i, 8);
            memcpy(&v1, p + STRIDE + i, 8);
            memcpy(&v2, p + 2 * STRIDE + i, 8);
            if (dst != NULL) {
                memcpy(dst + i, &v0, 8);
                memcpy(dst + STRIDE + i, &v1, 8);
                memcpy(dst + 2 * STRIDE + i, &v2, 8);
            }
            c = __builtin_ia32_crc32di(c, v0);
            c1 = __builtin_ia32_crc32di(c1, v1);
            c2 = __builtin_ia32_crc32di(c2, v2);
        }
        c = shift(shift2, (uint32_t)c) ^ shift(shift1, (uint32_t)c1) ^ (uint32_t)c2;
        p += 3 * STRIDE;
        n -= 3 * STRIDE;
        if (dst != NULL) {
            dst += 3 * STRIDE;
        }
    }
    if (dst != NULL) {
        memcpy(dst, p, n);
    }
    return ~(uint32_t)crc_serial(c, p, n);
}

__attribute__((target("sse4.2"))) static uint32_t
crc32c_continue(uint32_t previous, const unsigned char *p, size_t n)
{
    return crc32c_pass(previous, p, n, NULL);
}

__attribute__((target("sse4.2"))) static uint32_t
crc32c_copy(uint32_t previous, const unsigned char *p, size_t n, unsigned char *dst)
{
    return crc32c_pass(previous, p, n, dst);
}
#else
static uint32_t
crc32c_continue(uint32_t previous, const unsigned char *p, size_t n)
{
    (void)p;
    (void)n;
    return previous; /* never called: without SSE4.2 the module does not load */
}

static uint32_t
crc32c_copy(uint32_t previous, const unsigned char *p, size_t n, unsigned char *dst)
{
    (void)p;
    (void)n;
    (void)dst;
    return previous; /* never called, as crc32c_continue */
}
#endif

PyDoc_STRVAR(crc32c_doc, "crc32c(data: bytes-like, previous=0) -> int\n\n"
                        "The CRC-32C the frames carry, as the crc32c package's crc32c(data, previous):\n"
                        "filechannel.engine.checksum.crc32c when the extension is built.");

static PyObject *
crc32c_py(PyObject *self, PyObject *args)
{
    Py_buffer view;
    unsigned int previous = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &view, &previous)) {
        return NULL;
    }
    uint32_t crc = crc32c_continue(previous, (const unsigned char *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

PyDoc_STRVAR(set_fold_doc, "set_fold(on: bool) -> bool\n\n"
                           "Whether long buffers' CRCs are folded (crc_fold) from now on, where the CPU can; the\n"
                           "setting before. For tests, which check the CRC both ways.");

static PyObject *
set_fold(PyObject *self, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0) {
        return NULL;
    }
    int before = fold_ok;
    fold_ok = on && fold_supported;
    return PyBool_FromLong(before);
}

PyDoc_STRVAR(encode_batch_doc,
             "encode_batch(values: list[bytes], timestamp, index_interval, since_index, rel_start, pos0,\n"
             "             max_before) -> (heads, idx, tix, nbytes, since_after)\n\n"
             "The 17-byte [length][crc][attributes 0][timestamp] head of each value's frame, and the\n"
             "sparse index entries of the batch: a record gets one when it starts index_interval bytes\n"
             "or more after the last one (since_index bytes before the batch). rel_start: the first\n"
             "record's offset minus the segment's base; pos0: its byte position in the segment;\n"
             "max_before: the largest timestamp before the batch. See record.encode_batch_py.");

static void
put_u32(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static PyObject *
encode_batch(PyObject *self, PyObject *args)
{
    PyObject *values;
    long long timestamp, index_interval, since, rel_start, pos0, max_before;
    if (!PyArg_ParseTuple(args, "O!LLLLLL", &PyList_Type, &values, &timestamp, &index_interval, &since, &rel_start,
                          &pos0, &max_before)) {
        return NULL;
    }
    unsigned char prefix[PREFIX];
    int64_t ts = (int64_t)timestamp;
    int64_t max_after = max_before > timestamp ? (int64_t)max_before : ts;
    prefix[0] = 0;
    memcpy(prefix + 1, &ts, 8);
    uint32_t prefix_crc = crc32c_continue(0, prefix, PREFIX);
    Py_ssize_t n = PyList_GET_SIZE(values);
    PyObject *heads = PyList_New(n);
    unsigned char *idx = PyMem_Malloc((size_t)n * 8 + 1);
    unsigned char *tix = PyMem_Malloc((size_t)n * 12 + 1);
    PyObject *result = NULL;
    if (heads == NULL || idx == NULL || tix == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    long long pos = 0;
    Py_ssize_t marks = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        if (!PyBytes_CheckExact(v)) {
            PyErr_Format(PyExc_TypeError, "values must be bytes, not %.100s", Py_TYPE(v)->tp_name);
            goto done;
        }
        Py_ssize_t len = PyBytes_GET_SIZE(v);
        if (len > (Py_ssize_t)(UINT32_MAX - PREFIX)) {
            PyErr_SetString(PyExc_OverflowError, "a value of 4 GiB or more does not fit a frame");
            goto done;
        }
        if (since >= index_interval) {
            long long rel = rel_start + i, at = pos0 + pos;
            if (rel < 0 || rel > (long long)UINT32_MAX || at < 0 || at > (long long)UINT32_MAX) {
                PyErr_SetString(PyExc_OverflowError, "an index entry does not fit: the segment is over 4 GiB");
                goto done;
            }
            int64_t max_ts = i == 0 ? (int64_t)max_before : max_after;
            put_u32(idx + marks * 8, (uint32_t)rel);
            put_u32(idx + marks * 8 + 4, (uint32_t)at);
            memcpy(tix + marks * 12, &max_ts, 8);
            put_u32(tix + marks * 12 + 8, (uint32_t)rel);
            marks++;
            since = 0;
        }
        PyObject *head = PyBytes_FromStringAndSize(NULL, HEAD);
        if (head == NULL) {
            goto done;
        }
        unsigned char *h = (unsigned char *)PyBytes_AS_STRING(head);
        uint32_t length = (uint32_t)len + PREFIX;
        put_u32(h, length);
        put_u32(h + 4, crc32c_continue(prefix_crc, (const unsigned char *)PyBytes_AS_STRING(v), (size_t)len));
        memcpy(h + 8, prefix, PREFIX);
        PyList_SET_ITEM(heads, i, head);
        pos += len + HEAD;
        since += len + HEAD;
    }
    result = Py_BuildValue("Oy#y#LL", heads, (const char *)idx, marks * 8, (const char *)tix, marks * 12, pos, since);
done:
    Py_XDECREF(heads);
    PyMem_Free(idx);
    PyMem_Free(tix);
    return result;
}

/* A new instance of the tuple subclass type with n items (all NULL: set each before use),
   left out of the cycle collector. Records of ints, bytes, None and empty headers cannot be
   in a cycle, and the collections that a million new tracked records a second set off walk
   every one of them. A named tuple (a tuple's layout, no instance __dict__) is made with
   PyObject_GC_NewVar, untracked from the start: PyType_GenericAlloc zero-fills the whole
   object and tracks it, only for it to be untracked again. */
static PyObject *
new_untracked(PyTypeObject *type, Py_ssize_t n)
{
    PyObject *t;
    if (type->tp_dictoffset == 0 && type->tp_basicsize == PyTuple_Type.tp_basicsize) {
        t = (PyObject *)PyObject_GC_NewVar(PyTupleObject, type, n);
        if (t != NULL) {
            memset(((PyTupleObject *)t)->ob_item, 0, (size_t)n * sizeof(PyObject *));
        }
    } else {
        t = type->tp_alloc(type, n);
        if (t != NULL) {
            PyObject_GC_UnTrack(t);
        }
    }
    return t;
}

#define SHAPED_MAX_FIELDS 32

/* Reads a tuple of positions into out (at most max, each in [-1, limit)); -1 with an exception set. */
static Py_ssize_t
positions(PyObject *tuple, Py_ssize_t *out, Py_ssize_t max, Py_ssize_t limit, const char *what)
{
    Py_ssize_t n = PyTuple_GET_SIZE(tuple);
    if (n > max) {
        PyErr_Format(PyExc_ValueError, "%s: at most %zd positions", what, max);
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t pos = PyLong_AsSsize_t(PyTuple_GET_ITEM(tuple, k));
        if (pos == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (pos < -1 || pos >= limit) {
            PyErr_Format(PyExc_ValueError, "%s: position %zd is outside the template", what, pos);
            return -1;
        }
        out[k] = pos;
    }
    return n;
}

PyDoc_STRVAR(decode_plain_doc,
             "decode_plain(buf: bytes-like, pos, offset, max_records, out: list, record_type, template: tuple,"
             " slots: tuple[int, int, int, int, int]) -> (pos, count, status)\n\n"
             "Append a record_type (a tuple subclass) to out for each whole, CRC-valid frame of a plain\n"
             "record (no key, no headers) from pos on: template with the record's offset, timestamp, value\n"
             "and len(value) at slots[0:4] and a new empty list at slots[4] (-1: left out). status 0:\n"
             "stopped at max_records, the end of buf or an incomplete frame; 1: the frame at pos is not a\n"
             "plain record (key, headers or too short: the caller decodes it); 2: its CRC does not match.");

enum { SLOT_OFFSET, SLOT_TIMESTAMP, SLOT_VALUE, SLOT_VALUE_SIZE, SLOT_NEW_LIST, DECODE_SLOTS };

static PyObject *
decode_plain(PyObject *self, PyObject *args)
{
    Py_buffer view;
    PyObject *out, *template, *slots_arg;
    PyTypeObject *record_type;
    Py_ssize_t pos, max_records;
    long long offset;
    if (!PyArg_ParseTuple(args, "y*nLnO!O!O!O!", &view, &pos, &offset, &max_records, &PyList_Type, &out, &PyType_Type,
                          &record_type, &PyTuple_Type, &template, &PyTuple_Type, &slots_arg)) {
        return NULL;
    }
    PyObject *result = NULL, *size = NULL, *timestamp = NULL;
    int64_t last_ts = 0;
    const unsigned char *b = (const unsigned char *)view.buf;
    Py_ssize_t end = view.len, nt = PyTuple_GET_SIZE(template);
    Py_ssize_t count = 0, last_vlen = -1;
    Py_ssize_t slots[DECODE_SLOTS];
    int status = 0, track = 0;
    if (!PyType_IsSubtype(record_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a tuple subclass");
        goto done;
    }
    if (positions(slots_arg, slots, DECODE_SLOTS, nt, "slots") != DECODE_SLOTS || slots[SLOT_OFFSET] < 0 ||
        slots[SLOT_TIMESTAMP] < 0 || slots[SLOT_VALUE] < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "slots: the positions of the offset, timestamp and value, and of the value's size and a new list or -1");
        }
        goto done;
    }
    if (pos < 0) {
        PyErr_SetString(PyExc_ValueError, "pos must be >= 0");
        goto done;
    }
    /* The template's constants are copied into each record; its slots are written once, by the
       fields made for them (a slot filled with its constant first cost a reference taken and
       dropped per record). */
    Py_ssize_t constants[SHAPED_MAX_FIELDS], nconst = 0;
    if (nt > SHAPED_MAX_FIELDS) {
        PyErr_Format(PyExc_ValueError, "template: at most %d items", SHAPED_MAX_FIELDS);
        goto done;
    }
    for (Py_ssize_t k = 0; k < nt; k++) {
        int uses = 0;
        for (int j = 0; j < DECODE_SLOTS; j++) {
            uses += slots[j] == k;
        }
        if (uses > 1) {
            PyErr_Format(PyExc_ValueError, "slots: position %zd is given twice", k);
            goto done;
        }
        if (!uses) {
            constants[nconst++] = k;
        }
    }
    /* Records of ints, bytes and the template's constants are left out of the cycle collector
       (see new_untracked), unless a constant could be part of a cycle. */
    for (Py_ssize_t k = 0; k < nt && !track; k++) {
        PyObject *item = PyTuple_GET_ITEM(template, k);
        track = PyType_IS_GC(Py_TYPE(item)) && PyObject_GC_IsTracked(item);
    }
    while (count < max_records && pos <= end - HEAD) {
        uint32_t length, crc;
        int64_t ts;
        memcpy(&length, b + pos, 4);
        memcpy(&crc, b + pos + 4, 4);
        Py_ssize_t stop = pos + FRAME_HEADER + (Py_ssize_t)length;
        if (stop > end) {
            break;
        }
        if (b[pos + FRAME_HEADER] != 0 || length < PREFIX) {
            status = 1;
            break;
        }
        Py_ssize_t vlen = (Py_ssize_t)length - PREFIX;
        /* A long value is copied into its bytes while its CRC is checked, one pass over it
           (DESIGN.md, "Record"); a short one is copied after a CRC of its frame, which costs
           less for it than two calls. */
        int fused = vlen >= FUSED_COPY_MIN;
        PyObject *value = PyBytes_FromStringAndSize(fused ? NULL : (const char *)b + pos + HEAD, vlen);
        if (value == NULL) {
            goto done;
        }
        uint32_t got = fused ? crc32c_copy(crc32c_continue(0, b + pos + FRAME_HEADER, PREFIX), b + pos + HEAD,
                                           (size_t)vlen, (unsigned char *)PyBytes_AS_STRING(value))
                             : crc32c_continue(0, b + pos + FRAME_HEADER, length);
        if (got != crc) {
            Py_DECREF(value);
            status = 2;
            break;
        }
        memcpy(&ts, b + pos + FRAME_HEADER + 1, 8);
        if (slots[SLOT_VALUE_SIZE] >= 0 && (size == NULL || last_vlen != vlen)) {
            /* a batch's values mostly share a length: one int for them (above 256 it is not cached) */
            Py_XSETREF(size, PyLong_FromSsize_t(vlen));
            last_vlen = vlen;
            if (size == NULL) {
                Py_DECREF(value);
                goto done;
            }
        }
        PyObject *record = new_untracked(record_type, nt);
        if (record == NULL) {
            Py_DECREF(value);
            goto done;
        }
        for (Py_ssize_t k = 0; k < nconst; k++) {
            PyObject *item = PyTuple_GET_ITEM(template, constants[k]);
            PyTuple_SET_ITEM(record, constants[k], Py_NewRef(item));
        }
        if (timestamp == NULL || last_ts != ts) {
            /* records written together share their millisecond: one int for them, as for sizes */
            Py_XSETREF(timestamp, PyLong_FromLongLong(ts));
            last_ts = ts;
            if (timestamp == NULL) {
                Py_DECREF(value);
                Py_DECREF(record);
                goto done;
            }
        }
        PyObject *fields[DECODE_SLOTS] = {
            PyLong_FromLongLong(offset + count),
            Py_NewRef(timestamp),
            value,
            Py_XNewRef(size),
            slots[SLOT_NEW_LIST] >= 0 ? PyList_New(0) : NULL,
        };
        int failed = 0;
        for (int k = 0; k < DECODE_SLOTS; k++) {
            if (slots[k] < 0) {
                continue; /* only the size and the list may be left out: nothing was made for them */
            }
            if (fields[k] == NULL) {
                failed = 1;
                continue;
            }
            if (k == SLOT_NEW_LIST) {
                PyObject_GC_UnTrack(fields[k]); /* a new empty list cannot be in a cycle */
            }
            PyTuple_SET_ITEM(record, slots[k], fields[k]);
        }
        failed = failed || PyList_Append(out, record);
        Py_DECREF(record); /* out holds it, or it goes with the fields set in it */
        if (failed) {
            goto done;
        }
        if (track) {
            PyObject_GC_Track(record);
        }
        pos = stop;
        count++;
    }
    result = Py_BuildValue("nni", pos, count, status);
done:
    Py_XDECREF(size);
    Py_XDECREF(timestamp);
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(decode_columns_doc,
             "decode_columns(buf: bytes-like, pos, offset, max_records, columns: list[bytearray], keep_from, keep_to)"
             " -> (pos, count, status)\n\n"
             "Append each whole, CRC-valid frame from pos on whose offset is in [keep_from, keep_to) to columns\n"
             "(the others are checked and counted, not appended), eight buffers laid out as Arrow lays out\n"
             "a record batch's columns (native byte order): offsets (int64), timestamps (int64), key ends (int32,\n"
             "after a leading 0), key bytes, key validity (a bitmap, bit i for row i), value ends, value bytes,\n"
             "value validity. Header fields are checked and skipped. status 0: stopped at max_records, the end of\n"
             "buf or an incomplete frame; 1: the frame at pos is whole and CRC-valid but not decoded here (its\n"
             "fields are malformed, or a header name is not UTF-8: the caller's decoder says how); 2: its CRC does\n"
             "not match. See columns.RecordColumns.");

enum { COL_OFFSETS, COL_TIMESTAMPS, COL_KEY_ENDS, COL_KEYS, COL_KEY_VALID, COL_VALUE_ENDS, COL_VALUES, COL_VALUE_VALID, COLUMNS };

/* Where the key and the value of the payload [q, stop) of a frame of attributes `attrs` lie: 0, or
   -1 if its fields run past it, set bits it does not know or a header name is not UTF-8. */
static int
payload_fields(const unsigned char *b, Py_ssize_t q, Py_ssize_t stop, unsigned attrs, Py_ssize_t *key, Py_ssize_t *klen,
               Py_ssize_t *value)
{
    if (attrs & ~0x07u) {
        return -1;
    }
    *key = *klen = -1;
    if (attrs & 0x01u) {
        uint32_t n;
        if (stop - q < 4) {
            return -1;
        }
        memcpy(&n, b + q, 4);
        if ((Py_ssize_t)n > stop - q - 4) {
            return -1;
        }
        *key = q + 4;
        *klen = (Py_ssize_t)n;
        q += 4 + (Py_ssize_t)n;
    }
    if (attrs & 0x02u) {
        uint16_t count;
        if (stop - q < 2) {
            return -1;
        }
        memcpy(&count, b + q, 2);
        q += 2;
        for (unsigned h = 0; h < count; h++) {
            uint16_t nlen;
            uint32_t vlen;
            if (stop - q < 2) {
                return -1;
            }
            memcpy(&nlen, b + q, 2);
            if ((Py_ssize_t)nlen > stop - q - 2) {
                return -1;
            }
            PyObject *name = PyUnicode_DecodeUTF8((const char *)b + q + 2, nlen, "strict");
            if (name == NULL) {
                PyErr_Clear();
                return -1;
            }
            Py_DECREF(name);
            q += 2 + (Py_ssize_t)nlen;
            if (stop - q < 4) {
                return -1;
            }
            memcpy(&vlen, b + q, 4);
            if ((Py_ssize_t)vlen > stop - q - 4) {
                return -1;
            }
            q += 4 + (Py_ssize_t)vlen;
        }
    }
    if ((attrs & 0x04u) && q != stop) {
        return -1; /* a tombstone has no value bytes */
    }
    *value = (attrs & 0x04u) ? -1 : q;
    return 0;
}

static PyObject *
decode_columns(PyObject *self, PyObject *args)
{
    Py_buffer view;
    PyObject *list;
    Py_ssize_t pos, max_records;
    long long offset, keep_from, keep_to;
    if (!PyArg_ParseTuple(args, "y*nLnO!LL", &view, &pos, &offset, &max_records, &PyList_Type, &list, &keep_from, &keep_to)) {
        return NULL;
    }
    PyObject *result = NULL, *cols[COLUMNS];
    Py_ssize_t had[COLUMNS], count = 0, kept = 0;
    const unsigned char *b = (const unsigned char *)view.buf;
    Py_ssize_t end = view.len;
    int status = 0, resized = 0;
    if (PyList_GET_SIZE(list) != COLUMNS) {
        PyErr_Format(PyExc_ValueError, "columns: a list of %d bytearrays", COLUMNS);
        goto done;
    }
    for (int k = 0; k < COLUMNS; k++) {
        cols[k] = PyList_GET_ITEM(list, k);
        if (!PyByteArray_CheckExact(cols[k])) {
            PyErr_Format(PyExc_TypeError, "columns: a list of %d bytearrays", COLUMNS);
            goto done;
        }
        had[k] = PyByteArray_GET_SIZE(cols[k]);
    }
    Py_ssize_t rows = had[COL_OFFSETS] / 8, bitmap = (rows + 7) / 8;
    if (had[COL_OFFSETS] % 8 || had[COL_TIMESTAMPS] != 8 * rows || had[COL_KEY_ENDS] != 4 * (rows + 1) ||
        had[COL_VALUE_ENDS] != 4 * (rows + 1) || had[COL_KEY_VALID] != bitmap || had[COL_VALUE_VALID] != bitmap) {
        PyErr_SetString(PyExc_ValueError, "columns: buffers of different row counts");
        goto done;
    }
    if (pos < 0) {
        PyErr_SetString(PyExc_ValueError, "pos must be >= 0");
        goto done;
    }
    /* Room for the most frames buf can hold (each at least HEAD bytes, its key and value inside
       it): the buffers are grown once, then cut to what was written. */
    Py_ssize_t room = end > pos ? end - pos : 0, most = room / HEAD;
    most = max_records < most ? (max_records > 0 ? max_records : 0) : most;
    if (had[COL_KEYS] > INT32_MAX - room || had[COL_VALUES] > INT32_MAX - room) {
        PyErr_SetString(PyExc_OverflowError, "columns: keys or values past 2 GiB (Arrow's binary offsets): take them first");
        goto done;
    }
    Py_ssize_t want[COLUMNS] = {
        had[COL_OFFSETS] + 8 * most, had[COL_TIMESTAMPS] + 8 * most, had[COL_KEY_ENDS] + 4 * most,
        had[COL_KEYS] + room,        (rows + most + 7) / 8,            had[COL_VALUE_ENDS] + 4 * most,
        had[COL_VALUES] + room,      (rows + most + 7) / 8,
    };
    resized = 1;
    for (int k = 0; k < COLUMNS; k++) {
        if (PyByteArray_Resize(cols[k], want[k]) < 0) {
            goto done;
        }
    }
    unsigned char *col[COLUMNS];
    for (int k = 0; k < COLUMNS; k++) {
        col[k] = (unsigned char *)PyByteArray_AS_STRING(cols[k]);
    }
    memset(col[COL_KEY_VALID] + bitmap, 0, (size_t)(want[COL_KEY_VALID] - bitmap));
    memset(col[COL_VALUE_VALID] + bitmap, 0, (size_t)(want[COL_VALUE_VALID] - bitmap));
    int32_t key_end = (int32_t)had[COL_KEYS], value_end = (int32_t)had[COL_VALUES];
    while (count < max_records && pos <= end - HEAD) {
        uint32_t length, crc;
        memcpy(&length, b + pos, 4);
        memcpy(&crc, b + pos + 4, 4);
        Py_ssize_t stop = pos + FRAME_HEADER + (Py_ssize_t)length;
        if (stop > end) {
            break;
        }
        if (length < PREFIX || crc32c_continue(0, b + pos + FRAME_HEADER, length) != crc) {
            status = 2;
            break;
        }
        Py_ssize_t key, klen, value, row = rows + kept;
        if (payload_fields(b, pos + HEAD, stop, b[pos + FRAME_HEADER], &key, &klen, &value) < 0) {
            status = 1;
            break;
        }
        long long at = offset + count;
        if (at >= keep_from && at < keep_to) {
            memcpy(col[COL_OFFSETS] + had[COL_OFFSETS] + 8 * kept, &at, 8);
            memcpy(col[COL_TIMESTAMPS] + had[COL_TIMESTAMPS] + 8 * kept, b + pos + FRAME_HEADER + 1, 8);
            if (key >= 0) {
                memcpy(col[COL_KEYS] + key_end, b + key, (size_t)klen);
                key_end += (int32_t)klen;
                col[COL_KEY_VALID][row >> 3] |= (unsigned char)(1u << (row & 7));
            }
            if (value >= 0) {
                memcpy(col[COL_VALUES] + value_end, b + value, (size_t)(stop - value));
                value_end += (int32_t)(stop - value);
                col[COL_VALUE_VALID][row >> 3] |= (unsigned char)(1u << (row & 7));
            }
            memcpy(col[COL_KEY_ENDS] + had[COL_KEY_ENDS] + 4 * kept, &key_end, 4);
            memcpy(col[COL_VALUE_ENDS] + had[COL_VALUE_ENDS] + 4 * kept, &value_end, 4);
            kept++;
        }
        pos = stop;
        count++;
    }
    Py_ssize_t got[COLUMNS] = {
        had[COL_OFFSETS] + 8 * kept, had[COL_TIMESTAMPS] + 8 * kept, had[COL_KEY_ENDS] + 4 * kept,
        key_end,                     (rows + kept + 7) / 8,           had[COL_VALUE_ENDS] + 4 * kept,
        value_end,                   (rows + kept + 7) / 8,
    };
    for (int k = 0; k < COLUMNS; k++) {
        if (PyByteArray_Resize(cols[k], got[k]) < 0) {
            goto done;
        }
    }
    resized = 0;
    result = Py_BuildValue("nni", pos, count, status);
done:
    if (resized) { /* an error after growing them: the columns as they were (shrinking does not fail) */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        for (int k = 0; k < COLUMNS; k++) {
            if (PyByteArray_GET_SIZE(cols[k]) != had[k] && PyByteArray_Resize(cols[k], had[k]) < 0) {
                PyErr_Clear();
            }
        }
        PyErr_Restore(type, value, tb);
    }
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(shaped_doc,
             "shaped(record_type, template: tuple, records: list[tuple], slots: tuple[int, ...],"
             " size_slots: tuple[int, ...] = (), headers_type: list | tuple | None = None) -> list\n\n"
             "For each r of records, a record_type (a tuple subclass) that is template with r[k] at slots[k];\n"
             "with size_slots, Kafka's serialized key, value and header sizes of an (offset, timestamp, key,\n"
             "value, headers) record at those positions (-1: left out); with headers_type, its headers as a\n"
             "list or a tuple. See record.shaped_py.");

/* len(obj) of a bytes-like key or value, -1 for None; -2 with an exception set. */
static Py_ssize_t
size_of(PyObject *obj)
{
    if (obj == Py_None) {
        return -1;
    }
    if (PyBytes_CheckExact(obj)) {
        return PyBytes_GET_SIZE(obj);
    }
    Py_ssize_t n = PyObject_Length(obj);
    return n < 0 ? -2 : n;
}

/* Kafka's serialized header size: UTF-8 names plus values, -1 without headers; -2 on error. */
static Py_ssize_t
headers_size(PyObject *headers)
{
    if (PyTuple_CheckExact(headers) && PyTuple_GET_SIZE(headers) == 0) {
        return -1; /* the shared () of a record without headers: the common case */
    }
    PyObject *seq = PySequence_Fast(headers, "headers must be a sequence");
    if (seq == NULL) {
        return -2;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), total = n ? 0 : -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0))) {
            PyErr_SetString(PyExc_TypeError, "a header must be a (str, bytes) tuple");
            Py_DECREF(seq);
            return -2;
        }
        Py_ssize_t name_len;
        if (PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &name_len) == NULL) {
            Py_DECREF(seq);
            return -2;
        }
        Py_ssize_t value_len = size_of(PyTuple_GET_ITEM(pair, 1));
        if (value_len == -2) {
            Py_DECREF(seq);
            return -2;
        }
        total += name_len + (value_len < 0 ? 0 : value_len);
    }
    Py_DECREF(seq);
    return total;
}

static PyObject *
shaped(PyObject *self, PyObject *args)
{
    PyTypeObject *record_type;
    PyObject *template, *records, *slots_arg, *size_slots_arg = NULL, *headers_type = Py_None;
    if (!PyArg_ParseTuple(args, "O!O!O!O!|O!O", &PyType_Type, &record_type, &PyTuple_Type, &template, &PyList_Type, &records,
                          &PyTuple_Type, &slots_arg, &PyTuple_Type, &size_slots_arg, &headers_type)) {
        return NULL;
    }
    int headers_list = headers_type == (PyObject *)&PyList_Type, headers_tuple = headers_type == (PyObject *)&PyTuple_Type;
    if (headers_type != Py_None && !headers_list && !headers_tuple) {
        PyErr_SetString(PyExc_TypeError, "headers_type must be list, tuple or None");
        return NULL;
    }
    if (!PyType_IsSubtype(record_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a tuple subclass");
        return NULL;
    }
    Py_ssize_t nt = PyTuple_GET_SIZE(template), n = PyList_GET_SIZE(records);
    Py_ssize_t slots[SHAPED_MAX_FIELDS], size_slots[3];
    Py_ssize_t nslots = positions(slots_arg, slots, SHAPED_MAX_FIELDS, nt, "slots");
    Py_ssize_t nsizes = nslots < 0 ? -1 : size_slots_arg == NULL ? 0 : positions(size_slots_arg, size_slots, 3, nt, "size_slots");
    if (nsizes < 0) {
        return NULL;
    }
    if ((nsizes || headers_type != Py_None) && nslots != 5) {
        PyErr_SetString(PyExc_TypeError, "sizes and headers_type need (offset, timestamp, key, value, headers) records");
        return NULL;
    }
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        return NULL;
    }
    /* Records of a batch mostly share their sizes: one int object each, not one per record
       (sizes above 256 are not among CPython's cached small ints). */
    PyObject *last_size[3] = {NULL, NULL, NULL};
    Py_ssize_t last_measured[3] = {0, 0, 0};
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(records, i);
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != nslots) {
            PyErr_Format(PyExc_TypeError, "records must be tuples of %zd fields, not %.100s", nslots, Py_TYPE(r)->tp_name);
            Py_CLEAR(out);
            goto done;
        }
        Py_ssize_t measured[3] = {-1, -1, -1};
        if (nsizes) {
            measured[0] = size_of(PyTuple_GET_ITEM(r, 2));
            measured[1] = measured[0] == -2 ? -2 : size_of(PyTuple_GET_ITEM(r, 3));
            measured[2] = measured[1] == -2 ? -2 : headers_size(PyTuple_GET_ITEM(r, 4));
            if (measured[2] == -2) {
                Py_CLEAR(out);
                goto done;
            }
        }
        PyObject *t = new_untracked(record_type, nt);
        if (t == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        for (Py_ssize_t k = 0; k < nt; k++) {
            PyObject *item = PyTuple_GET_ITEM(template, k);
            Py_INCREF(item);
            PyTuple_SET_ITEM(t, k, item);
        }
        PyList_SET_ITEM(out, i, t); /* from here, an error frees t with out */
        for (Py_ssize_t k = 0; k < nslots + nsizes; k++) {
            Py_ssize_t pos = k < nslots ? slots[k] : size_slots[k - nslots];
            if (pos < 0) {
                continue;
            }
            PyObject *item;
            if (k >= nslots) {
                Py_ssize_t j = k - nslots;
                if (last_size[j] == NULL || last_measured[j] != measured[j]) {
                    Py_XSETREF(last_size[j], PyLong_FromSsize_t(measured[j]));
                    last_measured[j] = measured[j];
                }
                item = Py_XNewRef(last_size[j]);
            } else if (k == 4 && headers_list) {
                PyObject *headers = PyTuple_GET_ITEM(r, 4);
                int none = PyTuple_CheckExact(headers) && PyTuple_GET_SIZE(headers) == 0;
                item = none ? PyList_New(0) : PySequence_List(headers);
                if (none && item != NULL) {
                    /* A new empty list cannot be in a cycle: left out of the collector, as the tuples are
                       (a tracked list per record made every record tracked: a poll loop ran 3 times slower). */
                    PyObject_GC_UnTrack(item);
                }
            } else if (k == 4 && headers_tuple) {
                item = PySequence_Tuple(PyTuple_GET_ITEM(r, 4));
            } else {
                item = PyTuple_GET_ITEM(r, k);
                Py_INCREF(item);
            }
            if (item == NULL) {
                Py_CLEAR(out);
                goto done;
            }
            Py_SETREF(((PyTupleObject *)t)->ob_item[pos], item);
        }
        int may_cycle = 0;
        for (Py_ssize_t k = 0; k < nt && !may_cycle; k++) {
            PyObject *item = PyTuple_GET_ITEM(t, k);
            may_cycle = PyType_IS_GC(Py_TYPE(item)) && PyObject_GC_IsTracked(item);
        }
        if (may_cycle) {
            PyObject_GC_Track(t); /* the rule the collector applies to plain tuples */
        }
    }
done:
    for (int j = 0; j < 3; j++) {
        Py_XDECREF(last_size[j]);
    }
    return out;
}

PyDoc_STRVAR(scan_frames_doc,
             "scan_frames(buf: bytes, pos, offset, max_payload, interval, since, max_ts, marks: list)\n"
             "    -> (p, offset, since, max_ts, invalid)\n\n"
             "Walk the whole frames of buf (read from file position pos; its first frame has offset\n"
             "offset), checking each length and CRC, and append (offset, position, max_ts before it)\n"
             "to marks for a frame that starts interval bytes or more after the last mark (since:\n"
             "bytes before buf). Stops at the end of buf, an incomplete frame (invalid False) or a\n"
             "bad one (invalid True); p is where. See segment.scan_frames_py.");

static PyObject *
scan_frames(PyObject *self, PyObject *args)
{
    PyObject *buf, *marks;
    long long pos, offset, max_payload, interval, since, max_ts;
    if (!PyArg_ParseTuple(args, "SLLLLLLO!", &buf, &pos, &offset, &max_payload, &interval, &since, &max_ts, &PyList_Type,
                          &marks)) {
        return NULL;
    }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(buf);
    Py_ssize_t n = PyBytes_GET_SIZE(buf), p = 0;
    int invalid = 0;
    while (p <= n - FRAME_HEADER) {
        uint32_t length, crc;
        int64_t ts;
        memcpy(&length, b + p, 4);
        memcpy(&crc, b + p + 4, 4);
        if (length < PREFIX || (long long)length > max_payload) {
            invalid = 1;
            break;
        }
        if ((Py_ssize_t)length > n - p - FRAME_HEADER) {
            break;
        }
        Py_ssize_t stop = p + FRAME_HEADER + (Py_ssize_t)length;
        if (crc32c_continue(0, b + p + FRAME_HEADER, length) != crc) {
            invalid = 1;
            break;
        }
        if (since >= interval) {
            PyObject *mark = Py_BuildValue("(LLL)", offset, pos + (long long)p, max_ts);
            if (mark == NULL || PyList_Append(marks, mark) < 0) {
                Py_XDECREF(mark);
                return NULL;
            }
            Py_DECREF(mark);
            since = 0;
        }
        since += stop - p;
        memcpy(&ts, b + p + FRAME_HEADER + 1, 8);
        if (ts > max_ts) {
            max_ts = ts;
        }
        offset++;
        p = stop;
    }
    return Py_BuildValue("nLLLO", p, offset, since, max_ts, invalid ? Py_True : Py_False);
}

#ifdef RWF_NOWAIT
PyDoc_STRVAR(pread_nowait_doc,
             "pread_nowait(fd, size, position) -> bytes\n\n"
             "os.preadv(fd, [buffer], position, os.RWF_NOWAIT) into a new bytes object: up to size\n"
             "bytes the page cache holds from position on (b\"\" at the end of the file); OSError\n"
             "(BlockingIOError if the first page is not cached) as os.preadv raises it. A bytearray\n"
             "for os.preadv is zeroed first, which cost an event loop's 64 KiB reads a fifth of\n"
             "their rate (cursor._RawSource.read_cached).");

static PyObject *
pread_nowait(PyObject *self, PyObject *args)
{
    int fd;
    Py_ssize_t size;
    long long position;
    if (!PyArg_ParseTuple(args, "inL", &fd, &size, &position)) {
        return NULL;
    }
    if (size < 0 || position < 0) {
        PyErr_SetString(PyExc_ValueError, "pread_nowait: size and position must not be negative");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL) {
        return NULL;
    }
    struct iovec iov = {PyBytes_AS_STRING(out), (size_t)size};
    ssize_t n;
    int err;
    do {
        Py_BEGIN_ALLOW_THREADS n = preadv2(fd, &iov, 1, (off_t)position, RWF_NOWAIT);
        err = errno;
        Py_END_ALLOW_THREADS
    } while (n < 0 && err == EINTR && PyErr_CheckSignals() == 0);
    if (n < 0) {
        Py_DECREF(out);
        if (err != EINTR) { /* else PyErr_CheckSignals set the error */
            errno = err;
            PyErr_SetFromErrno(PyExc_OSError);
        }
        return NULL;
    }
    if (n != size && _PyBytes_Resize(&out, n) < 0) {
        return NULL;
    }
    return out;
}
#endif

/* -- a drain's write, without the GIL ----------------------------------------------------
 *
 * files.write_pieces (its Python reference) with the GIL released for the whole batch, not
 * per call: the background flusher writes a sender's full buffer (Appender, "handing the
 * buffer over") while the sending thread goes on running Python on the other CPU. The
 * Python version joins small pieces holding the GIL and takes the GIL back between calls,
 * which a busy sender holds for a switch interval (5 ms) at a time. The pieces are kept
 * referenced (a tuple of them) while the GIL is released: bytes do not move or change. */

static int
write_all_nogil(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t done = write(fd, p, n);
        if (done < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -1;
        }
        p += done;
        n -= (size_t)done;
    }
    return 0;
}

/* Small pieces (an average under join_below) copied into buffers of up to write_bytes, each
 * written with one write; large ones handed to writev, at most iov_max pieces and about
 * writev_bytes at a time (files.py says why these limits). The joins go to *scratch (of
 * *scratch_cap bytes), grown as needed and kept by the caller: a fresh megabyte each time
 * is a fresh mapping, faulted in page by page (a write-behind of 1 MiB buffers took three
 * times as long). 0 done, -1 errno set. */
static int
write_iov_nogil(int fd, struct iovec *iov, Py_ssize_t count, size_t nbytes, size_t write_bytes, size_t writev_bytes,
                Py_ssize_t iov_max, size_t join_below, char **scratch, size_t *scratch_cap)
{
    if (nbytes < join_below * (size_t)count) {
        size_t cap = nbytes < write_bytes ? nbytes : write_bytes;
        if (cap > *scratch_cap || *scratch == NULL) {
            char *grown = realloc(*scratch, cap > 0 ? cap : 1);
            if (grown == NULL) {
                errno = ENOMEM;
                return -1;
            }
            *scratch = grown;
            *scratch_cap = cap > 0 ? cap : 1;
        }
        char *buf = *scratch;
        size_t used = 0;
        int rc = 0;
        for (Py_ssize_t i = 0; i < count && rc == 0; i++) {
            const char *p = iov[i].iov_base;
            size_t left = iov[i].iov_len;
            while (left > 0 && rc == 0) {
                size_t take = cap - used < left ? cap - used : left;
                memcpy(buf + used, p, take);
                used += take;
                p += take;
                left -= take;
                if (used == cap) {
                    rc = write_all_nogil(fd, buf, used);
                    used = 0;
                }
            }
        }
        if (rc == 0 && used > 0) {
            rc = write_all_nogil(fd, buf, used);
        }
        return rc;
    }
    Py_ssize_t i = 0;
    while (i < count) {
        Py_ssize_t j = i;
        size_t size = 0;
        while (j < count && j - i < iov_max && (j == i || size < writev_bytes)) {
            size += iov[j].iov_len;
            j++;
        }
        ssize_t done;
        do {
            done = writev(fd, iov + i, (int)(j - i));
        } while (done < 0 && errno == EINTR);
        if (done < 0) {
            return -1;
        }
        /* a short write (rare on files): finish piece by piece */
        for (Py_ssize_t k = i; k < j; k++) {
            size_t len = iov[k].iov_len;
            if ((size_t)done >= len) {
                done -= (ssize_t)len;
            }
            else if (write_all_nogil(fd, (const char *)iov[k].iov_base + done, len - (size_t)done) < 0) {
                return -1;
            }
            else {
                done = 0;
            }
        }
        i = j;
    }
    return 0;
}

/* The pieces of the list (bytes, nbytes in all) as a tuple that keeps them alive and an
 * iovec array over their bytes (PyMem_Free it). 0 done, -1 error set. */
static int
collect_pieces(PyObject *list, Py_ssize_t nbytes, PyObject **keep, struct iovec **out, Py_ssize_t *count)
{
    PyObject *pieces = PyList_AsTuple(list);
    if (pieces == NULL) {
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(pieces);
    struct iovec *iov = PyMem_Malloc(sizeof(struct iovec) * (size_t)(n > 0 ? n : 1));
    if (iov == NULL) {
        Py_DECREF(pieces);
        PyErr_NoMemory();
        return -1;
    }
    size_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *piece = PyTuple_GET_ITEM(pieces, i);
        if (!PyBytes_Check(piece)) {
            PyErr_Format(PyExc_TypeError, "write_pieces: piece %zd is %.100s, not bytes", i, Py_TYPE(piece)->tp_name);
            goto fail;
        }
        iov[i].iov_base = PyBytes_AS_STRING(piece);
        iov[i].iov_len = (size_t)PyBytes_GET_SIZE(piece);
        total += iov[i].iov_len;
    }
    if (total != (size_t)nbytes) {
        PyErr_Format(PyExc_ValueError, "write_pieces: the pieces hold %zu bytes, not %zd", total, nbytes);
        goto fail;
    }
    *keep = pieces;
    *out = iov;
    *count = n;
    return 0;
fail:
    PyMem_Free(iov);
    Py_DECREF(pieces);
    return -1;
}

typedef struct {
    Py_ssize_t write_bytes, writev_bytes, iov_max, join_below;
} WriteLimits;

static int
check_limits(const WriteLimits *l)
{
    if (l->write_bytes < 1 || l->writev_bytes < 1 || l->iov_max < 1 || l->join_below < 0) {
        PyErr_SetString(PyExc_ValueError, "write_pieces: limits must be positive");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(write_pieces_doc,
             "write_pieces(fd, pieces, nbytes, write_bytes, writev_bytes, iov_max, join_below)\n\n"
             "files.write_pieces with the GIL released for the whole batch: the bytes of the list\n"
             "pieces (nbytes in all) written in order at fd's position; OSError on failure (part may\n"
             "be written).");

static PyObject *
write_pieces_c(PyObject *self, PyObject *args)
{
    int fd;
    PyObject *list, *pieces;
    Py_ssize_t nbytes, count;
    WriteLimits l;
    struct iovec *iov;
    if (!PyArg_ParseTuple(args, "iO!nnnnn", &fd, &PyList_Type, &list, &nbytes, &l.write_bytes, &l.writev_bytes,
                          &l.iov_max, &l.join_below) ||
        check_limits(&l) < 0 || collect_pieces(list, nbytes, &pieces, &iov, &count) < 0) {
        return NULL;
    }
    int rc, err;
    char *scratch = NULL;
    size_t scratch_cap = 0;
    Py_BEGIN_ALLOW_THREADS rc = write_iov_nogil(fd, iov, count, (size_t)nbytes, (size_t)l.write_bytes,
                                                (size_t)l.writev_bytes, l.iov_max, (size_t)l.join_below, &scratch,
                                                &scratch_cap);
    err = errno;
    free(scratch);
    Py_END_ALLOW_THREADS
    PyMem_Free(iov);
    Py_DECREF(pieces);
    if (rc < 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

/* WriteBehind: one write at a time, submitted by a sender holding the GIL and written by a
 * writer thread without the GIL (Appender's write-behind): the drain's records (pieces, as
 * write_pieces writes them), then its "after" writes in order (index entries, the writer
 * state: (fd, bytes, offset), offset -1 for the fd's position). A write runs IDLE ->
 * SUBMITTED (submit) -> DONE (written, or failed: its errno kept) -> IDLE (collect, with
 * the GIL, by whichever thread comes first: the next submitter, a thread waiting for it, or
 * the writer thread once it has lingered). The writer thread stays in C from one write to
 * the next while they are collected in time: a busy sender holds the GIL for a switch
 * interval (5 ms) at a time, which a writer thread needing the GIL between writes would
 * wait for each time. */
enum { WB_IDLE, WB_SUBMITTED, WB_DONE };

typedef struct {
    int fd;
    const char *data;
    size_t len;
    long long offset;
} AfterWrite;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state;
    int closed;
    int err; /* of the DONE write: 0, or the errno it failed with */
    Py_ssize_t failed_at; /* where it failed: -1 the pieces, i the after write i */
    int fd;
    PyObject *pieces; /* the tuples that keep the bytes alive, owned from submit to collect */
    PyObject *after;
    struct iovec *iov;
    Py_ssize_t count;
    size_t nbytes;
    AfterWrite *afters;
    Py_ssize_t n_after;
    WriteLimits limits;
    char *scratch; /* the joins' buffer, kept from write to write (write_iov_nogil) */
    size_t scratch_cap;
} WriteBehind;

static PyObject *
wb_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (!_PyArg_NoPositional("WriteBehind", args) || !_PyArg_NoKeywords("WriteBehind", kwds)) {
        return NULL;
    }
    WriteBehind *self = (WriteBehind *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    if (pthread_mutex_init(&self->mu, NULL) != 0 || pthread_cond_init(&self->cv, NULL) != 0) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

static void
wb_release_job(WriteBehind *self)
{
    Py_CLEAR(self->pieces);
    Py_CLEAR(self->after);
    PyMem_Free(self->iov);
    PyMem_Free(self->afters);
    self->iov = NULL;
    self->afters = NULL;
}

static void
wb_dealloc(WriteBehind *self)
{
    wb_release_job(self);
    free(self->scratch);
    pthread_cond_destroy(&self->cv);
    pthread_mutex_destroy(&self->mu);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
wb_state(WriteBehind *self)
{
    pthread_mutex_lock(&self->mu);
    int state = self->state;
    pthread_mutex_unlock(&self->mu);
    return state;
}

/* The after writes as a tuple that keeps them alive and an array over them. 0, -1 error set. */
static int
collect_after(PyObject *list, PyObject **keep, AfterWrite **out, Py_ssize_t *count)
{
    PyObject *after = PySequence_Tuple(list);
    if (after == NULL) {
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(after);
    AfterWrite *w = PyMem_Malloc(sizeof(AfterWrite) * (size_t)(n > 0 ? n : 1));
    if (w == NULL) {
        Py_DECREF(after);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(after, i), *data;
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "iSL", &w[i].fd, &data, &w[i].offset)) {
            if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "WriteBehind.submit: after write %zd is not (fd, bytes, offset)", i);
            }
            PyMem_Free(w);
            Py_DECREF(after);
            return -1;
        }
        w[i].data = PyBytes_AS_STRING(data);
        w[i].len = (size_t)PyBytes_GET_SIZE(data);
    }
    *keep = after;
    *out = w;
    *count = n;
    return 0;
}

static PyObject *
wb_submit(WriteBehind *self, PyObject *args)
{
    int fd;
    PyObject *list, *after_list, *pieces, *after;
    Py_ssize_t nbytes, count, n_after;
    WriteLimits l;
    struct iovec *iov;
    AfterWrite *afters;
    if (!PyArg_ParseTuple(args, "iO!nnnnnO", &fd, &PyList_Type, &list, &nbytes, &l.write_bytes, &l.writev_bytes,
                          &l.iov_max, &l.join_below, &after_list) ||
        check_limits(&l) < 0) {
        return NULL;
    }
    if (self->closed || wb_state(self) != WB_IDLE) {
        PyErr_SetString(PyExc_RuntimeError,
                        self->closed ? "WriteBehind.submit: closed" : "WriteBehind.submit: the last write is not collected");
        return NULL;
    }
    if (collect_pieces(list, nbytes, &pieces, &iov, &count) < 0) {
        return NULL;
    }
    if (collect_after(after_list, &after, &afters, &n_after) < 0) {
        PyMem_Free(iov);
        Py_DECREF(pieces);
        return NULL;
    }
    self->pieces = pieces;
    self->after = after;
    self->iov = iov;
    self->count = count;
    self->afters = afters;
    self->n_after = n_after;
    self->fd = fd;
    self->nbytes = (size_t)nbytes;
    self->limits = l;
    pthread_mutex_lock(&self->mu);
    self->state = WB_SUBMITTED;
    pthread_cond_broadcast(&self->cv);
    pthread_mutex_unlock(&self->mu);
    Py_RETURN_NONE;
}

/* The submitted write, without the GIL: 0, or the errno it failed with (*failed_at: where). */
static int
wb_write(WriteBehind *self, Py_ssize_t *failed_at)
{
    const WriteLimits *l = &self->limits;
    *failed_at = -1;
    if (write_iov_nogil(self->fd, self->iov, self->count, self->nbytes, (size_t)l->write_bytes, (size_t)l->writev_bytes,
                        l->iov_max, (size_t)l->join_below, &self->scratch, &self->scratch_cap) < 0) {
        return errno > 0 ? errno : EIO;
    }
    for (Py_ssize_t i = 0; i < self->n_after; i++) {
        const AfterWrite *w = &self->afters[i];
        *failed_at = i;
        if (w->offset < 0) {
            if (write_all_nogil(w->fd, w->data, w->len) < 0) {
                return errno > 0 ? errno : EIO;
            }
            continue;
        }
        size_t done = 0;
        while (done < w->len) {
            ssize_t n = pwrite(w->fd, w->data + done, w->len - done, (off_t)(w->offset + (long long)done));
            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n < 0) {
                return errno > 0 ? errno : EIO;
            }
            done += (size_t)n;
        }
    }
    return 0;
}

static PyObject *
wb_run(WriteBehind *self, PyObject *arg)
{
    double linger = PyFloat_AsDouble(arg);
    if (linger == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    if (!(linger > 0)) {
        PyErr_SetString(PyExc_ValueError, "WriteBehind.run: linger must be positive");
        return NULL;
    }
    int result;
    Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&self->mu);
    for (;;) {
        while (self->state != WB_SUBMITTED && !self->closed) {
            pthread_cond_wait(&self->cv, &self->mu);
        }
        if (self->state != WB_SUBMITTED) {
            result = -1; /* closed, nothing to write */
            break;
        }
        pthread_mutex_unlock(&self->mu); /* the submitter leaves a SUBMITTED write alone */
        Py_ssize_t failed_at;
        int err = wb_write(self, &failed_at);
        pthread_mutex_lock(&self->mu);
        self->err = err;
        self->failed_at = failed_at;
        self->state = WB_DONE;
        pthread_cond_broadcast(&self->cv);
        /* Linger for the collect (a sender's next submit, or a thread waiting): then write on. */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        long long ns = until.tv_nsec + (long long)(linger * 1e9);
        until.tv_sec += (time_t)(ns / 1000000000LL);
        until.tv_nsec = (long)(ns % 1000000000LL);
        int timed_out = 0;
        while (self->state == WB_DONE && !self->closed && !timed_out) {
            timed_out = pthread_cond_timedwait(&self->cv, &self->mu, &until) == ETIMEDOUT;
        }
        if (self->state == WB_DONE) {
            result = 1; /* not collected in time: the caller collects it */
            break;
        }
    }
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(result);
}

static PyObject *
wb_poll(WriteBehind *self, PyObject *Py_UNUSED(ignored))
{
    pthread_mutex_lock(&self->mu);
    int state = self->state, err = self->err;
    pthread_mutex_unlock(&self->mu);
    if (state != WB_DONE) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLong(err);
}

static PyObject *
wb_wait(WriteBehind *self, PyObject *Py_UNUSED(ignored))
{
    Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&self->mu);
    while (self->state == WB_SUBMITTED && !self->closed) {
        pthread_cond_wait(&self->cv, &self->mu);
    }
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS
    return wb_poll(self, NULL);
}

static PyObject *
wb_collect(WriteBehind *self, PyObject *Py_UNUSED(ignored))
{
    pthread_mutex_lock(&self->mu);
    int state = self->state, err = self->err;
    Py_ssize_t failed_at = self->failed_at;
    if (state == WB_DONE) {
        self->state = WB_IDLE;
        pthread_cond_broadcast(&self->cv);
    }
    pthread_mutex_unlock(&self->mu);
    if (state != WB_DONE) {
        PyErr_SetString(PyExc_RuntimeError, "WriteBehind.collect: no write is done");
        return NULL;
    }
    wb_release_job(self);
    return Py_BuildValue("(in)", err, err ? failed_at : (Py_ssize_t)-1);
}

static PyObject *
wb_close(WriteBehind *self, PyObject *Py_UNUSED(ignored))
{
    pthread_mutex_lock(&self->mu);
    self->closed = 1;
    pthread_cond_broadcast(&self->cv);
    pthread_mutex_unlock(&self->mu);
    Py_RETURN_NONE;
}

static PyMethodDef wb_methods[] = {
    {"submit", (PyCFunction)wb_submit, METH_VARARGS,
     "submit(fd, pieces, nbytes, write_bytes, writev_bytes, iov_max, join_below, after): hand a write to the "
     "writer thread: write_pieces of pieces, then each (fd, bytes, offset) of after (offset -1: at the fd's "
     "position). RuntimeError unless the last one is collected, or after close()."},
    {"run", (PyCFunction)wb_run, METH_O,
     "run(linger) -> int: the writer thread's loop, without the GIL: write each write submitted; return 1 once "
     "one stays uncollected for linger seconds (collect it, run again), -1 once closed with nothing submitted."},
    {"poll", (PyCFunction)wb_poll, METH_NOARGS, "poll() -> int | None: the errno (0: written) of a write done, else None."},
    {"wait", (PyCFunction)wb_wait, METH_NOARGS, "wait() -> int | None: poll() once no write is in flight (waits without the GIL)."},
    {"collect", (PyCFunction)wb_collect, METH_NOARGS,
     "collect() -> (errno, failed_at): end the write done, so the next can be submitted; errno 0: written, else "
     "failed_at is where it failed (-1: the pieces, i: the after write i)."},
    {"close", (PyCFunction)wb_close, METH_NOARGS, "close(): run returns -1 once nothing is submitted."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WriteBehind_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "filechannel.engine._codec.WriteBehind",
    .tp_basicsize = sizeof(WriteBehind),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "WriteBehind(): one write at a time, submitted by one thread and written by another without the GIL.",
    .tp_dealloc = (destructor)wb_dealloc,
    .tp_new = wb_new,
    .tp_methods = wb_methods,
};

/* -- the per-message append -------------------------------------------------------------
 *
 * StateCore holds the writer state's counters as C integers (writer_state.WriterState
 * subclasses it); AppendCore holds the appender's buffer and limits (appender.Appender
 * subclasses it). Python reads and writes them as ordinary attributes. AppendCore.append
 * is Appender.append's common case in C: a key-less, header-less bytes value while the
 * writer lock is held, the buffer already non-empty and nothing due (no roll, no drain,
 * no hold-limit check). It takes the appender's mutex like the Python code does; in any
 * other case it calls Appender._append_stamped, the whole path in Python, which stays the
 * reference (tests/channel/test_append_core.py checks the two write the same bytes).
 */

typedef struct {
    PyObject_HEAD
    long long segment_base, segment_id, segment_size, end_offset, since_index, max_timestamp, created_ms;
} StateCore;

static PyMemberDef state_members[] = {
    {"segment_base", T_LONGLONG, offsetof(StateCore, segment_base), 0, NULL},
    {"segment_id", T_LONGLONG, offsetof(StateCore, segment_id), 0, NULL},
    {"segment_size", T_LONGLONG, offsetof(StateCore, segment_size), 0, NULL},
    {"end_offset", T_LONGLONG, offsetof(StateCore, end_offset), 0, NULL},
    {"since_index", T_LONGLONG, offsetof(StateCore, since_index), 0, NULL},
    {"max_timestamp", T_LONGLONG, offsetof(StateCore, max_timestamp), 0, NULL},
    {"created_ms", T_LONGLONG, offsetof(StateCore, created_ms), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject StateCore_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "filechannel.engine._codec.StateCore",
    .tp_basicsize = sizeof(StateCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The writer state's counters as C integers (see writer_state.WriterState).",
    .tp_members = state_members,
    .tp_new = PyType_GenericNew,
};

typedef struct {
    PyObject_HEAD
    PyObject *mutex, *state, *pending, *index;
    long long pending_bytes, roll_bytes, max_payload, index_interval, buffer_bytes, prefix_ts, wall_offset_ns;
    double check_at, flush_due;
    unsigned int prefix_crc;
    char always, flushing;
} AppendCore;

static PyMemberDef core_members[] = {
    {"_mutex", T_OBJECT_EX, offsetof(AppendCore, mutex), 0, NULL},
    {"_state", T_OBJECT, offsetof(AppendCore, state), 0, NULL},
    {"_pending", T_OBJECT_EX, offsetof(AppendCore, pending), 0, NULL},
    {"_index", T_OBJECT_EX, offsetof(AppendCore, index), 0, NULL},
    {"_pending_bytes", T_LONGLONG, offsetof(AppendCore, pending_bytes), 0, NULL},
    {"_roll_bytes", T_LONGLONG, offsetof(AppendCore, roll_bytes), 0, NULL},
    {"_max_payload", T_LONGLONG, offsetof(AppendCore, max_payload), 0, NULL},
    {"_index_interval", T_LONGLONG, offsetof(AppendCore, index_interval), 0, NULL},
    {"_buffer_bytes", T_LONGLONG, offsetof(AppendCore, buffer_bytes), 0, NULL},
    {"_prefix_ts", T_LONGLONG, offsetof(AppendCore, prefix_ts), 0, NULL},
    {"_wall_offset_ns", T_LONGLONG, offsetof(AppendCore, wall_offset_ns), 0, NULL},
    {"_prefix_crc", T_UINT, offsetof(AppendCore, prefix_crc), 0, NULL},
    {"_check_at", T_DOUBLE, offsetof(AppendCore, check_at), 0, NULL},
    {"_flush_due", T_DOUBLE, offsetof(AppendCore, flush_due), 0, NULL},
    {"_always", T_BOOL, offsetof(AppendCore, always), 0, NULL},
    {"_flushing", T_BOOL, offsetof(AppendCore, flushing), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *str_append_stamped, *str_key, *str_headers, *str_timestamp;

static int
core_traverse(AppendCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->mutex);
    Py_VISIT(self->state);
    Py_VISIT(self->pending);
    Py_VISIT(self->index);
    return 0;
}

static int
core_clear(AppendCore *self)
{
    Py_CLEAR(self->mutex);
    Py_CLEAR(self->state);
    Py_CLEAR(self->pending);
    Py_CLEAR(self->index);
    return 0;
}

static void
core_dealloc(AppendCore *self)
{
    PyObject_GC_UnTrack(self);
    core_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* -- Mutex: the appender's lock, takeable from C without a Python call ------------------------
 *
 * threading.Lock's acquire parses its arguments as keywords (PyArg_ParseTupleAndKeywords) and
 * is reached through a method lookup: with release, about a tenth of a send (perf, 100 B).
 * A Mutex is the same lock (PyThread_type_lock, not reentrant, released by any thread) with
 * the same Python methods, so threading.Condition and ``with`` take it as they take a Lock,
 * while AppendCore tries it in C (mutex_try). A blocking acquire waits without the GIL and
 * runs signal handlers when woken by one, as Lock.acquire does.
 */

typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    char locked;
} Mutex;

static PyTypeObject Mutex_Type;

static PyObject *
mutex_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "Mutex() takes no arguments");
        return NULL;
    }
    Mutex *self = (Mutex *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->lock = PyThread_allocate_lock();
    if (self->lock == NULL) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_MemoryError, "cannot allocate a lock");
        return NULL;
    }
    return (PyObject *)self;
}

static void
mutex_dealloc(Mutex *self)
{
    if (self->lock != NULL) {
        if (self->locked) {
            PyThread_release_lock(self->lock);
        }
        PyThread_free_lock(self->lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Take it without waiting: 1 taken, 0 held elsewhere. */
static inline int
mutex_try(Mutex *self)
{
    if (PyThread_acquire_lock_timed(self->lock, 0, 0) == PY_LOCK_ACQUIRED) {
        self->locked = 1;
        return 1;
    }
    return 0;
}

static inline void
mutex_release_held(Mutex *self)
{
    self->locked = 0;
    PyThread_release_lock(self->lock);
}

static long long
monotonic_us(void)
{
    struct timespec tp;
    clock_gettime(CLOCK_MONOTONIC, &tp);
    return (long long)tp.tv_sec * 1000000LL + tp.tv_nsec / 1000;
}

/* Wait up to timeout_us (-1: for ever) without the GIL: 1 taken, 0 timed out, -1 a signal
 * handler raised (its error set). */
static int
mutex_wait(Mutex *self, long long timeout_us)
{
    if (mutex_try(self)) {
        return 1;
    }
    if (timeout_us == 0) {
        return 0;
    }
    long long deadline = timeout_us < 0 ? -1 : monotonic_us() + timeout_us;
    for (;;) {
        long long wait = -1;
        if (deadline >= 0) {
            wait = deadline - monotonic_us();
            if (wait < 0) {
                wait = 0;
            }
            if (wait > (long long)PY_TIMEOUT_MAX) {
                wait = (long long)PY_TIMEOUT_MAX;
            }
        }
        PyLockStatus r;
        Py_BEGIN_ALLOW_THREADS r = PyThread_acquire_lock_timed(self->lock, (PY_TIMEOUT_T)wait, 1);
        Py_END_ALLOW_THREADS
        if (r == PY_LOCK_ACQUIRED) {
            self->locked = 1;
            return 1;
        }
        if (r == PY_LOCK_INTR) {
            if (Py_MakePendingCalls() < 0) {
                return -1;
            }
            continue;
        }
        if (deadline >= 0 && monotonic_us() >= deadline) {
            return 0;
        }
    }
}

static PyObject *
mutex_acquire(Mutex *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *blocking = Py_True, *timeout = NULL;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "acquire() takes at most 2 arguments");
        return NULL;
    }
    if (nargs > 0) {
        blocking = args[0];
    }
    if (nargs > 1) {
        timeout = args[1];
    }
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (PyUnicode_CompareWithASCIIString(name, "blocking") == 0 && nargs < 1) {
            blocking = args[nargs + i];
        }
        else if (PyUnicode_CompareWithASCIIString(name, "timeout") == 0 && nargs < 2) {
            timeout = args[nargs + i];
        }
        else {
            PyErr_Format(PyExc_TypeError, "acquire() got an unexpected keyword argument %R", name);
            return NULL;
        }
    }
    int block = PyObject_IsTrue(blocking);
    if (block < 0) {
        return NULL;
    }
    double secs = -1;
    if (timeout != NULL) {
        secs = PyFloat_AsDouble(timeout);
        if (secs == -1 && PyErr_Occurred()) {
            return NULL;
        }
    }
    if (!block && secs != -1) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (secs < 0 && secs != -1) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    long long timeout_us = !block ? 0 : secs < 0 ? -1 : (long long)(secs * 1e6);
    int got = mutex_wait(self, timeout_us);
    if (got < 0) {
        return NULL;
    }
    return PyBool_FromLong(got);
}

static PyObject *
mutex_enter(Mutex *self, PyObject *Py_UNUSED(ignored))
{
    if (mutex_wait(self, -1) < 0) {
        return NULL;
    }
    Py_RETURN_TRUE;
}

static PyObject *
mutex_release(Mutex *self, PyObject *Py_UNUSED(ignored))
{
    if (!self->locked) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return NULL;
    }
    mutex_release_held(self);
    Py_RETURN_NONE;
}

static PyObject *
mutex_exit(Mutex *self, PyObject *const *args, Py_ssize_t nargs)
{
    return mutex_release(self, NULL);
}

static PyObject *
mutex_locked(Mutex *self, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(self->locked);
}

static PyMethodDef mutex_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))mutex_acquire, METH_FASTCALL | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1) -> bool: threading.Lock.acquire."},
    {"release", (PyCFunction)mutex_release, METH_NOARGS, "release(): threading.Lock.release."},
    {"locked", (PyCFunction)mutex_locked, METH_NOARGS, "locked() -> bool: threading.Lock.locked."},
    {"__enter__", (PyCFunction)mutex_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))mutex_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Mutex_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "filechannel.engine._codec.Mutex",
    .tp_basicsize = sizeof(Mutex),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Mutex(): threading.Lock that AppendCore takes without a Python call (see appender.py).",
    .tp_dealloc = (destructor)mutex_dealloc,
    .tp_methods = mutex_methods,
    .tp_new = mutex_new,
};

/* PyObject_TypeCheck(obj, base), remembering (with a reference) the last subtype that passed:
 * the appender and its state are each an instance of one Python subclass, and walking its MRO
 * on every send showed in perf. */
static inline int
is_kind(PyObject *obj, PyTypeObject *base, PyTypeObject **last)
{
    PyTypeObject *t = Py_TYPE(obj);
    if (t == base || t == *last) {
        return 1;
    }
    if (!PyType_IsSubtype(t, base)) {
        return 0;
    }
    Py_INCREF(t);
    Py_XSETREF(*last, t);
    return 1;
}

static PyTypeObject *last_state_type, *last_core_type;

/* The tuple (a, b) of two ints: what Py_BuildValue("(LL)") makes, without parsing its format per send. */
static PyObject *
pair_of(long long a, long long b)
{
    PyObject *x = PyLong_FromLongLong(a), *y = x == NULL ? NULL : PyLong_FromLongLong(b);
    PyObject *pair = y == NULL ? NULL : PyTuple_New(2);
    if (pair == NULL) {
        Py_XDECREF(x);
        Py_XDECREF(y);
        return NULL;
    }
    PyTuple_SET_ITEM(pair, 0, x);
    PyTuple_SET_ITEM(pair, 1, y);
    return pair;
}

static int
list_cut(PyObject *list, Py_ssize_t size)
{
    return PyList_SetSlice(list, size, PY_SSIZE_T_MAX, NULL);
}

/* The fast path with the mutex held: 1 done (*offset set), 0 not taken, -1 error. */
static int
core_append_locked(AppendCore *self, PyObject *value, long long ts, double now, long long *offset)
{
    StateCore *st = (StateCore *)self->state;
    PyObject *pending = self->pending, *index = self->index;
    if (st == NULL || !is_kind((PyObject *)st, &StateCore_Type, &last_state_type) || pending == NULL ||
        !PyList_CheckExact(pending) || index == NULL || !PyList_CheckExact(index)) {
        return 0;
    }
    long long len = (long long)PyBytes_GET_SIZE(value);
    long long size = len + HEAD;
    long long pos = st->segment_size + self->pending_bytes;
    /* Due but a drain in flight: the next drain writes it (see Appender._append_stamped). */
    if (PyList_GET_SIZE(pending) == 0 || now >= self->check_at || (now >= self->flush_due && !self->flushing) || self->always ||
        pos >= self->roll_bytes || len + PREFIX > self->max_payload || self->pending_bytes + size >= self->buffer_bytes) {
        return 0;
    }
    long long off = st->end_offset;
    PyObject *entry = NULL;
    if (st->since_index >= self->index_interval) {
        long long rel = off - st->segment_base;
        if (rel < 0 || rel > (long long)UINT32_MAX || pos < 0 || pos > (long long)UINT32_MAX) {
            return 0; /* the Python path raises the error */
        }
        unsigned char idx[8], tix[12];
        int64_t max_ts = (int64_t)st->max_timestamp;
        put_u32(idx, (uint32_t)rel);
        put_u32(idx + 4, (uint32_t)pos);
        memcpy(tix, &max_ts, 8);
        put_u32(tix + 8, (uint32_t)rel);
        entry = Py_BuildValue("(y#y#)", (const char *)idx, (Py_ssize_t)8, (const char *)tix, (Py_ssize_t)12);
        if (entry == NULL) {
            return -1;
        }
    }
    if (ts != self->prefix_ts) {
        unsigned char prefix[PREFIX];
        int64_t t = (int64_t)ts;
        prefix[0] = 0;
        memcpy(prefix + 1, &t, 8);
        self->prefix_ts = ts;
        self->prefix_crc = crc32c_continue(0, prefix, PREFIX);
    }
    PyObject *head = PyBytes_FromStringAndSize(NULL, HEAD);
    if (head == NULL) {
        Py_XDECREF(entry);
        return -1;
    }
    unsigned char *h = (unsigned char *)PyBytes_AS_STRING(head);
    int64_t t = (int64_t)ts;
    put_u32(h, (uint32_t)(len + PREFIX));
    put_u32(h + 4, crc32c_continue(self->prefix_crc, (const unsigned char *)PyBytes_AS_STRING(value), (size_t)len));
    h[8] = 0;
    memcpy(h + 9, &t, 8);
    Py_ssize_t n_pending = PyList_GET_SIZE(pending), n_index = PyList_GET_SIZE(index);
    int failed = (entry != NULL && PyList_Append(index, entry)) || PyList_Append(pending, head) ||
                 PyList_Append(pending, value);
    Py_XDECREF(entry);
    Py_DECREF(head);
    if (failed) {
        list_cut(pending, n_pending);
        list_cut(index, n_index);
        return -1;
    }
    st->since_index = entry != NULL ? size : st->since_index + size;
    if (ts > st->max_timestamp) {
        st->max_timestamp = ts;
    }
    st->end_offset = off + 1;
    self->pending_bytes += size;
    *offset = off;
    return 1;
}

PyDoc_STRVAR(core_append_doc,
             "append(value, *, key=None, headers=None, timestamp=None) -> offset\n\n"
             "Appender.append: the common case in C, anything else through Appender._append_stamped.");

/* Take the appender's Mutex holding the GIL when it is granted.
 *
 * A blocking acquire() waits without the GIL and is granted the lock without it: the
 * thread that released the lock, still holding the GIL, then finds it taken on its next
 * send and blocks in turn, and every send hands the lock and the GIL from thread to
 * thread (8 sender threads: 0.03-0.4x one thread's rate). So first try without blocking,
 * letting the other threads run (the GIL released, sched_yield) between tries: the holder
 * is a thread inside Python code that lost the GIL, and finishes once it gets it back.
 * After ACQUIRE_TRIES, block (the holder may be waiting for writer.lock, held by another
 * process). 0 taken, -1 error. */
#define ACQUIRE_TRIES 64

static int
acquire_mutex(Mutex *m)
{
    for (int i = 0; i < ACQUIRE_TRIES; i++) {
        if (mutex_try(m)) {
            return 0;
        }
        Py_BEGIN_ALLOW_THREADS sched_yield();
        Py_END_ALLOW_THREADS
    }
    return mutex_wait(m, -1) < 0 ? -1 : 0;
}

/* The fast path: 1 done (*offset, *ts set), 0 not taken (the caller goes to Python), -1 error.
 * have_ts: use *ts as the timestamp; else the timestamp is now, stored in *ts. */
static int
core_try_append(AppendCore *self, PyObject *value, int have_ts, long long *ts, long long *offset)
{
    if (self->mutex == NULL || !Py_IS_TYPE(self->mutex, &Mutex_Type)) {
        return 0; /* a lock other than the extension's Mutex: Python's path takes it */
    }
    /* One clock read: deadlines (check_at, flush_due) are on Python's time.monotonic(),
     * CLOCK_MONOTONIC, and the timestamp is that plus the wall clock's lead, which
     * Appender takes whenever it takes the writer lock, so at most the hold limit ago
     * (Appender._append computes it the same way). A step of the wall clock once kept
     * writer.lock held past the hold limit; a second clock read was a tenth of a send
     * (DESIGN.md, "Appending and locking"). */
    struct timespec tp;
    clock_gettime(CLOCK_MONOTONIC, &tp);
    long long mono_ns = (long long)tp.tv_sec * 1000000000LL + tp.tv_nsec;
    double now = (double)mono_ns / 1e9;
    if (!have_ts) {
        *ts = (mono_ns + self->wall_offset_ns) / 1000000;
    }
    Mutex *mutex = (Mutex *)self->mutex;
    Py_INCREF(mutex);
    if (acquire_mutex(mutex) < 0) {
        Py_DECREF(mutex);
        return -1;
    }
    int done = core_append_locked(self, value, *ts, now, offset);
    mutex_release_held(mutex);
    Py_DECREF(mutex);
    return done;
}

static PyObject *
core_append(AppendCore *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    int plain = nargs == 1 && PyBytes_CheckExact(args[0]);
    int have_ts = 0;
    long long ts = 0;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; plain && i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), *arg = args[nargs + i];
        if (name == str_timestamp && arg != Py_None) {
            int overflow;
            ts = PyLong_CheckExact(arg) ? PyLong_AsLongLongAndOverflow(arg, &overflow) : 0;
            plain = PyLong_CheckExact(arg) && !overflow && !(ts == -1 && PyErr_Occurred());
            have_ts = 1;
        }
        else if (!((name == str_key || name == str_headers || name == str_timestamp) && arg == Py_None)) {
            plain = 0; /* keys and headers, and argument errors, are the Python path's */
        }
    }
    if (plain) {
        long long offset = 0;
        int done = core_try_append(self, args[0], have_ts, &ts, &offset);
        if (done < 0) {
            return NULL;
        }
        if (done) {
            return PyLong_FromLongLong(offset);
        }
    }
    /* Appender._append_stamped, not _append: one Python frame less on the keyed path. */
    PyObject *full = PyObject_GetAttr((PyObject *)self, str_append_stamped);
    if (full == NULL) {
        return NULL;
    }
    PyObject *pair = PyObject_Vectorcall(full, args, nargs, kwnames);
    Py_DECREF(full);
    if (pair == NULL) {
        return NULL;
    }
    if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {
        Py_DECREF(pair);
        PyErr_SetString(PyExc_TypeError, "Appender._append_stamped must return (offset, timestamp)");
        return NULL;
    }
    PyObject *offset = PyTuple_GET_ITEM(pair, 0);
    Py_INCREF(offset);
    Py_DECREF(pair);
    return offset;
}

PyDoc_STRVAR(core_append_stamped_doc,
             "append_stamped(value) -> (offset, timestamp)\n\n"
             "Append one key-less, header-less record stamped now; return its offset and the timestamp\n"
             "it got (the Producer's metadata needs both, and a second clock read in Python cost more\n"
             "than the append). The common case in C, anything else through Appender._append_stamped.");

static PyObject *
core_append_stamped(AppendCore *self, PyObject *value)
{
    if (PyBytes_CheckExact(value)) {
        long long ts = 0, offset = 0;
        int done = core_try_append(self, value, 0, &ts, &offset);
        if (done < 0) {
            return NULL;
        }
        if (done) {
            return pair_of(offset, ts);
        }
    }
    return PyObject_CallMethodOneArg((PyObject *)self, str_append_stamped, value);
}

static PyMethodDef core_methods[] = {
    {"append", (PyCFunction)(void (*)(void))core_append, METH_FASTCALL | METH_KEYWORDS, core_append_doc},
    {"append_stamped", (PyCFunction)core_append_stamped, METH_O, core_append_stamped_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject AppendCore_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "filechannel.engine._codec.AppendCore",
    .tp_basicsize = sizeof(AppendCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The appender's buffer and limits, and the per-message append in C (see appender.Appender).",
    .tp_traverse = (traverseproc)core_traverse,
    .tp_clear = (inquiry)core_clear,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_members = core_members,
    .tp_methods = core_methods,
    .tp_new = PyType_GenericNew,
};

/* -- Producer.send's common case ------------------------------------------------------------
 *
 * A ProducerSend is bound as a Producer's ``send`` (client/producer.py): for a call
 * send(topic, value) with a bytes value and nothing else, and a topic in ``routes``
 * (topic -> (AppendCore, where)), it appends through core_try_append and returns a new
 * ``future_type`` (client/futures.SentFuture, a SentCore) with its ``_route`` slot and its
 * SentCore fields set: what the Python short path sets. Anything else, and a record
 * the C append does not take, goes to ``fallback`` (Producer._send, or Python's short
 * path for a record the appender's Python path must handle) with the same arguments.
 */

/* A SentCore is the base of client/futures.SentFuture: where a record went, as C fields.
 * ``_at`` (the pair (offset, timestamp)) and ``_size`` (the value's length) are made as
 * Python objects only when read, which most sends never do: the tuple and the three ints
 * a send made for them (and the tuple's GC tracking) were a fifth of a 100 B send. */

typedef struct {
    PyObject_HEAD
    long long offset, timestamp, size;
} SentCore;

static PyTypeObject SentCore_Type;

static PyObject *
sent_get_at(SentCore *self, void *closure)
{
    return pair_of(self->offset, self->timestamp);
}

static int
sent_set_at(SentCore *self, PyObject *value, void *closure)
{
    long long offset, timestamp;
    if (value == NULL || !PyTuple_Check(value) || !PyArg_ParseTuple(value, "LL", &offset, &timestamp)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "_at must be a tuple (offset, timestamp)");
        }
        return -1;
    }
    self->offset = offset;
    self->timestamp = timestamp;
    return 0;
}

/* Not a T_LONGLONG member: CPython 3.11 stores a member's -1 before it sees the conversion
 * failed, so a refused write (``_size = "3"``) would leave the size changed. */
static PyObject *
sent_get_size(SentCore *self, void *closure)
{
    return PyLong_FromLongLong(self->size);
}

static int
sent_set_size(SentCore *self, PyObject *value, void *closure)
{
    long long size = value == NULL ? -1 : PyLong_AsLongLong(value);
    if (size == -1 && (value == NULL || PyErr_Occurred())) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "_size cannot be deleted");
        }
        return -1;
    }
    self->size = size;
    return 0;
}

static PyGetSetDef sent_getset[] = {
    {"_at", (getter)sent_get_at, (setter)sent_set_at, "(offset, timestamp) of the record", NULL},
    {"_size", (getter)sent_get_size, (setter)sent_set_size, "the value's length in bytes", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SentCore_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "filechannel.engine._codec.SentCore",
    .tp_basicsize = sizeof(SentCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "SentCore: where a sent record went (offset, timestamp, size); the base of SentFuture (see client/futures.py).",
    .tp_getset = sent_getset,
    .tp_new = PyType_GenericNew,
};

typedef struct {
    PyObject_HEAD
    PyObject *routes, *fallback, *future_type;
    Py_ssize_t off_route;
    long long sent;
} ProducerSend;

static PyMemberDef psend_members[] = {
    {"sent", T_LONGLONG, offsetof(ProducerSend, sent), READONLY, "records sent through the C path"},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *str_timestamp_ms, *str_partition, *empty_tuple;

static int
psend_traverse(ProducerSend *self, visitproc visit, void *arg)
{
    Py_VISIT(self->routes);
    Py_VISIT(self->fallback);
    Py_VISIT(self->future_type);
    return 0;
}

static int
psend_clear(ProducerSend *self)
{
    Py_CLEAR(self->routes);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->future_type);
    return 0;
}

static void
psend_dealloc(ProducerSend *self)
{
    PyObject_GC_UnTrack(self);
    psend_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The offset of the object slot ``name`` of ``type`` (a __slots__ member), or -1 with an error set. */
static Py_ssize_t
slot_offset(PyObject *type, const char *name)
{
    PyObject *d = PyObject_GetAttrString(type, name);
    if (d == NULL) {
        return -1;
    }
    Py_ssize_t off = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type) && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX) {
        off = ((PyMemberDescrObject *)d)->d_member->offset;
    }
    else {
        PyErr_Format(PyExc_TypeError, "%s must be a __slots__ member", name);
    }
    Py_DECREF(d);
    return off;
}

static PyObject *
psend_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *routes, *fallback, *future_type;
    if (!PyArg_ParseTuple(args, "O!OO!", &PyDict_Type, &routes, &fallback, &PyType_Type, &future_type)) {
        return NULL;
    }
    ProducerSend *self = (ProducerSend *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    if (!PyType_IsSubtype((PyTypeObject *)future_type, &SentCore_Type)) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_TypeError, "future_type must be a subclass of SentCore");
        return NULL;
    }
    self->off_route = slot_offset(future_type, "_route");
    if (self->off_route < 0) {
        Py_DECREF(self);
        return NULL;
    }
    Py_INCREF(routes);
    Py_INCREF(fallback);
    Py_INCREF(future_type);
    self->routes = routes;
    self->fallback = fallback;
    self->future_type = future_type;
    return (PyObject *)self;
}

static void
set_slot(PyObject *obj, Py_ssize_t offset, PyObject *value)
{
    PyObject **slot = (PyObject **)((char *)obj + offset);
    PyObject *old = *slot;
    *slot = value; /* steals the reference */
    Py_XDECREF(old);
}

static PyObject *
psend_call(ProducerSend *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    int plain = nargs == 2 && PyUnicode_CheckExact(args[0]) && PyBytes_CheckExact(args[1]);
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; plain && i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        plain = args[nargs + i] == Py_None && (name == str_key || name == str_headers || name == str_partition ||
                                               name == str_timestamp_ms);
    }
    PyObject *route = plain ? PyDict_GetItemWithError(self->routes, args[0]) : NULL; /* borrowed */
    if (route == NULL && PyErr_Occurred()) {
        return NULL;
    }
    if (route != NULL && PyTuple_CheckExact(route) && PyTuple_GET_SIZE(route) == 2 &&
        is_kind(PyTuple_GET_ITEM(route, 0), &AppendCore_Type, &last_core_type)) {
        Py_INCREF(route); /* close() may empty the routes while the mutex is awaited */
        AppendCore *core = (AppendCore *)PyTuple_GET_ITEM(route, 0);
        long long ts = 0, offset = 0;
        int done = core_try_append(core, args[1], 0, &ts, &offset);
        if (done > 0) {
            PyTypeObject *ft = (PyTypeObject *)self->future_type;
            PyObject *future = ft->tp_new(ft, empty_tuple, NULL);
            if (future == NULL) {
                Py_DECREF(route);
                return NULL;
            }
            PyObject *where = PyTuple_GET_ITEM(route, 1);
            Py_INCREF(where);
            set_slot(future, self->off_route, where);
            SentCore *sent = (SentCore *)future;
            sent->offset = offset;
            sent->timestamp = ts;
            sent->size = (long long)PyBytes_GET_SIZE(args[1]);
            Py_DECREF(route);
            self->sent++;
            return future;
        }
        Py_DECREF(route);
        if (done < 0) {
            return NULL;
        }
    }
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyObject *
psend_vectorcall_entry(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return psend_call((ProducerSend *)callable, args, nargsf, kwnames);
}

static PyObject *
psend_tp_call(PyObject *callable, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call(callable, args, kwargs);
}

static PyObject *
psend_new_vc(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *self = psend_new(type, args, kwds);
    if (self != NULL) {
        *(vectorcallfunc *)((char *)self + type->tp_vectorcall_offset) = psend_vectorcall_entry;
    }
    return self;
}

typedef struct {
    ProducerSend base;
    vectorcallfunc vectorcall;
} ProducerSendVC;

static PyTypeObject ProducerSend_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "filechannel.engine._codec.ProducerSend",
    .tp_basicsize = sizeof(ProducerSendVC),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "ProducerSend(routes, fallback, future_type): Producer.send's common case in C (see client/producer.py).",
    .tp_traverse = (traverseproc)psend_traverse,
    .tp_clear = (inquiry)psend_clear,
    .tp_dealloc = (destructor)psend_dealloc,
    .tp_members = psend_members,
    .tp_new = psend_new_vc,
    .tp_call = psend_tp_call,
    .tp_vectorcall_offset = offsetof(ProducerSendVC, vectorcall),
};

/* -- AsyncProducer.send's common case -------------------------------------------------------
 *
 * A Ready is an awaitable that is already done: ``await`` gives its value (or raises its
 * error) without suspending; am_send hands the value over with no StopIteration made. It
 * has a coroutine's methods (``__await__``, ``send``, ``throw``, ``close``: what
 * collections.abc.Coroutine checks), so asyncio.create_task and asyncio.gather take it as
 * they take a coroutine, and a second await raises RuntimeError as a coroutine's does.
 * It holds a future or a delivery, never itself: no cycle, so it is not tracked by the GC.
 *
 * An AsyncSend is bound as an AsyncProducer's ``send`` (client/aio.py). A call
 * send(topic, value) (two positional arguments, no keywords) calls ``send`` (the
 * producer's) at once and returns a Ready of what it gave: the future itself if it is a
 * ``done_type`` (SentFuture, awaitable itself), else ``deliver(future)`` (a
 * RecordDelivery); an exception from either is raised by the Ready's await, where the
 * ``async def`` raised it. Any other call goes to ``slow``, the ``async def`` itself.
 */

typedef struct {
    PyObject_HEAD
    PyObject *value; /* what the await gives; NULL once awaited, closed or thrown into */
    PyObject *error; /* the exception the await raises instead, or NULL */
} Ready;

static PyTypeObject Ready_Type;

static void
ready_dealloc(Ready *self)
{
    Py_XDECREF(self->value);
    Py_XDECREF(self->error);
    PyObject_Free(self);
}

/* The value, once (0); -1 with the Ready's error, or RuntimeError if it was already awaited. */
static int
ready_take(Ready *self, PyObject **value)
{
    PyObject *error = self->error;
    if (error != NULL) {
        self->error = NULL;
        Py_CLEAR(self->value);
        PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(error)), error, PyException_GetTraceback(error));
        return -1;
    }
    if (self->value == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited coroutine");
        return -1;
    }
    *value = self->value;
    self->value = NULL;
    return 0;
}

static PySendResult
ready_am_send(PyObject *self, PyObject *arg, PyObject **result)
{
    return ready_take((Ready *)self, result) < 0 ? PYGEN_ERROR : PYGEN_RETURN;
}

static PyObject *
ready_next(PyObject *self)
{
    PyObject *value;
    if (ready_take((Ready *)self, &value) < 0) {
        return NULL;
    }
    PyObject *stop = PyObject_CallOneArg(PyExc_StopIteration, value); /* a tuple value stays one */
    Py_DECREF(value);
    if (stop != NULL) {
        PyErr_SetObject(PyExc_StopIteration, stop);
        Py_DECREF(stop);
    }
    return NULL;
}

static PyObject *
ready_send(PyObject *self, PyObject *arg)
{
    return ready_next(self);
}

static PyObject *
ready_throw(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "throw expected 1 to 3 arguments");
        return NULL;
    }
    Py_CLEAR(((Ready *)self)->value);
    Py_CLEAR(((Ready *)self)->error);
    PyObject *typ = args[0];
    if (PyExceptionInstance_Check(typ)) {
        PyErr_SetObject((PyObject *)Py_TYPE(typ), typ);
    }
    else if (PyExceptionClass_Check(typ)) {
        PyErr_SetObject(typ, nargs > 1 ? args[1] : NULL);
    }
    else {
        PyErr_SetString(PyExc_TypeError, "exceptions must derive from BaseException");
    }
    return NULL;
}

static PyObject *
ready_close(PyObject *self, PyObject *unused)
{
    Py_CLEAR(((Ready *)self)->value);
    Py_CLEAR(((Ready *)self)->error);
    Py_RETURN_NONE;
}

static PyMethodDef ready_methods[] = {
    {"send", ready_send, METH_O, "The value, as StopIteration (a coroutine's send)."},
    {"throw", (PyCFunction)(void (*)(void))ready_throw, METH_FASTCALL, "Raise the exception given (a coroutine's throw)."},
    {"close", ready_close, METH_NOARGS, "Forget the value (a coroutine's close)."},
    {NULL, NULL, 0, NULL},
};

static PyAsyncMethods ready_async = {
    .am_await = PyObject_SelfIter,
    .am_send = ready_am_send,
};

static PyTypeObject Ready_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "filechannel.engine._codec.Ready",
    .tp_basicsize = sizeof(Ready),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An awaitable already done: what AsyncProducer.send returns (see client/aio.py).",
    .tp_dealloc = (destructor)ready_dealloc,
    .tp_as_async = &ready_async,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = ready_next,
    .tp_methods = ready_methods,
};

typedef struct {
    PyObject_HEAD
    PyObject *send, *slow, *deliver, *done_type;
    vectorcallfunc vectorcall;
} AsyncSend;

static int
asend_traverse(AsyncSend *self, visitproc visit, void *arg)
{
    Py_VISIT(self->send);
    Py_VISIT(self->slow);
    Py_VISIT(self->deliver);
    Py_VISIT(self->done_type);
    return 0;
}

static int
asend_clear(AsyncSend *self)
{
    Py_CLEAR(self->send);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->deliver);
    Py_CLEAR(self->done_type);
    return 0;
}

static void
asend_dealloc(AsyncSend *self)
{
    PyObject_GC_UnTrack(self);
    asend_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
asend_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    AsyncSend *self = (AsyncSend *)callable;
    if (PyVectorcall_NARGS(nargsf) != 2 || kwnames != NULL) {
        return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
    }
    Ready *ready = PyObject_New(Ready, &Ready_Type);
    if (ready == NULL) {
        return NULL;
    }
    ready->error = NULL;
    PyObject *future = PyObject_Vectorcall(self->send, args, 2, NULL);
    if (future != NULL && !Py_IS_TYPE(future, (PyTypeObject *)self->done_type)) {
        Py_SETREF(future, PyObject_CallOneArg(self->deliver, future));
    }
    ready->value = future;
    if (future == NULL) { /* raised by the await, as the async def's body raised it */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL) {
            PyException_SetTraceback(value, tb);
        }
        Py_XDECREF(type);
        Py_XDECREF(tb);
        ready->error = value;
    }
    return (PyObject *)ready;
}

static PyObject *
asend_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *send, *slow, *deliver, *done_type;
    if (!PyArg_ParseTuple(args, "OOOO!", &send, &slow, &deliver, &PyType_Type, &done_type)) {
        return NULL;
    }
    AsyncSend *self = (AsyncSend *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->send = Py_NewRef(send);
    self->slow = Py_NewRef(slow);
    self->deliver = Py_NewRef(deliver);
    self->done_type = Py_NewRef(done_type);
    self->vectorcall = asend_call;
    return (PyObject *)self;
}

static PyTypeObject AsyncSend_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "filechannel.engine._codec.AsyncSend",
    .tp_basicsize = sizeof(AsyncSend),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "AsyncSend(send, slow, deliver, done_type): AsyncProducer.send's common case in C (see client/aio.py).",
    .tp_traverse = (traverseproc)asend_traverse,
    .tp_clear = (inquiry)asend_clear,
    .tp_dealloc = (destructor)asend_dealloc,
    .tp_new = asend_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(AsyncSend, vectorcall),
};

static PyMethodDef codec_methods[] = {
    {"crc32c", crc32c_py, METH_VARARGS, crc32c_doc},
    {"set_fold", set_fold, METH_O, set_fold_doc},
    {"encode_batch", encode_batch, METH_VARARGS, encode_batch_doc},
    {"shaped", shaped, METH_VARARGS, shaped_doc},
    {"decode_plain", decode_plain, METH_VARARGS, decode_plain_doc},
    {"decode_columns", decode_columns, METH_VARARGS, decode_columns_doc},
    {"scan_frames", scan_frames, METH_VARARGS, scan_frames_doc},
    {"write_pieces", write_pieces_c, METH_VARARGS, write_pieces_doc},
#ifdef RWF_NOWAIT
    {"pread_nowait", pread_nowait, METH_VARARGS, pread_nowait_doc},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef codec_module = {
    PyModuleDef_HEAD_INIT, "filechannel.engine._codec", "The frame codec's hot loops in C (see record.py).", -1, codec_methods,
};

PyMODINIT_FUNC
PyInit__codec(void)
{
#if FC_HAVE_SSE42
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        fold_ok = fold_supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq");
        init_shift(shift1, STRIDE);
        init_shift(shift2, 2 * STRIDE);
        if (PyType_Ready(&StateCore_Type) < 0 || PyType_Ready(&AppendCore_Type) < 0 || PyType_Ready(&SentCore_Type) < 0 ||
            PyType_Ready(&ProducerSend_Type) < 0 || PyType_Ready(&Ready_Type) < 0 || PyType_Ready(&AsyncSend_Type) < 0 ||
            PyType_Ready(&Mutex_Type) < 0 || PyType_Ready(&WriteBehind_Type) < 0) {
            return NULL;
        }
        str_append_stamped = PyUnicode_InternFromString("_append_stamped");
        str_key = PyUnicode_InternFromString("key");
        str_headers = PyUnicode_InternFromString("headers");
        str_timestamp = PyUnicode_InternFromString("timestamp");
        str_timestamp_ms = PyUnicode_InternFromString("timestamp_ms");
        str_partition = PyUnicode_InternFromString("partition");
        empty_tuple = PyTuple_New(0);
        if (!str_append_stamped || !str_key || !str_headers || !str_timestamp ||
            !str_timestamp_ms || !str_partition || !empty_tuple) {
            return NULL;
        }
        PyObject *m = PyModule_Create(&codec_module);
        if (m == NULL) {
            return NULL;
        }
        Py_INCREF(&StateCore_Type);
        Py_INCREF(&AppendCore_Type);
        Py_INCREF(&SentCore_Type);
        Py_INCREF(&ProducerSend_Type);
        Py_INCREF(&Ready_Type);
        Py_INCREF(&AsyncSend_Type);
        Py_INCREF(&Mutex_Type);
        Py_INCREF(&WriteBehind_Type);
        if (PyModule_AddObject(m, "StateCore", (PyObject *)&StateCore_Type) < 0 ||
            PyModule_AddObject(m, "AppendCore", (PyObject *)&AppendCore_Type) < 0 ||
            PyModule_AddObject(m, "SentCore", (PyObject *)&SentCore_Type) < 0 ||
            PyModule_AddObject(m, "ProducerSend", (PyObject *)&ProducerSend_Type) < 0 ||
            PyModule_AddObject(m, "Ready", (PyObject *)&Ready_Type) < 0 ||
            PyModule_AddObject(m, "AsyncSend", (PyObject *)&AsyncSend_Type) < 0 ||
            PyModule_AddObject(m, "Mutex", (PyObject *)&Mutex_Type) < 0 ||
            PyModule_AddObject(m, "WriteBehind", (PyObject *)&WriteBehind_Type) < 0) {
            Py_DECREF(m);
            return NULL;
        }
        return m;
    }
#endif
    PyErr_SetString(PyExc_ImportError, "filechannel.engine._codec needs an x86-64 CPU with SSE4.2 (hardware CRC-32C)");
    return NULL;
}
