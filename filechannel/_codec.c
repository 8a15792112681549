/* The frame codec's two hot loops in C: frame heads and index entries of a send_many
 * batch, and decoding frames of key-less, header-less records. filechannel/record.py holds the reference (pure
 * Python) version of both and uses this module only when it imports; the tests check
 * that the two agree byte for byte and record for record.
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

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FC_HAVE_SSE42 1
#else
#define FC_HAVE_SSE42 0
#endif

#define FRAME_HEADER 8
#define PREFIX 9
#define HEAD (FRAME_HEADER + PREFIX)

#if FC_HAVE_SSE42
/* crc32c(data, previous) of the crc32c package: continuing `previous` over `data`. */
__attribute__((target("sse4.2"))) static uint32_t
crc32c_continue(uint32_t previous, const unsigned char *p, size_t n)
{
    uint64_t c = (uint32_t)~previous;
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
    return ~c32;
}
#else
static uint32_t
crc32c_continue(uint32_t previous, const unsigned char *p, size_t n)
{
    (void)p;
    (void)n;
    return previous; /* never called: without SSE4.2 the module does not load */
}
#endif

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

PyDoc_STRVAR(decode_plain_doc,
             "decode_plain(buf: bytes, pos, offset, max_records, out: list, record_type, no_headers)"
             " -> (pos, count, status)\n\n"
             "Append record_type(offset, timestamp, None, value, no_headers) to out for each whole,\n"
             "CRC-valid frame of a plain record from pos on. status 0: stopped at max_records,\n"
             "the end of buf or an incomplete frame; 1: the frame at pos is not a plain record\n"
             "(key, headers or too short: the caller decodes it); 2: its CRC does not match.");

static PyObject *
decode_plain(PyObject *self, PyObject *args)
{
    PyObject *buf, *out, *no_headers;
    PyTypeObject *record_type;
    Py_ssize_t pos, max_records;
    long long offset;
    if (!PyArg_ParseTuple(args, "SnLnO!O!O", &buf, &pos, &offset, &max_records, &PyList_Type, &out, &PyType_Type,
                          &record_type, &no_headers)) {
        return NULL;
    }
    if (!PyType_IsSubtype(record_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a tuple subclass");
        return NULL;
    }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(buf);
    Py_ssize_t end = PyBytes_GET_SIZE(buf);
    Py_ssize_t count = 0;
    int status = 0;
    if (pos < 0) {
        PyErr_SetString(PyExc_ValueError, "pos must be >= 0");
        return NULL;
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
        if (crc32c_continue(0, b + pos + FRAME_HEADER, length) != crc) {
            status = 2;
            break;
        }
        memcpy(&ts, b + pos + FRAME_HEADER + 1, 8);
        PyObject *value = PyBytes_FromStringAndSize((const char *)b + pos + HEAD, (Py_ssize_t)length - PREFIX);
        PyObject *off = PyLong_FromLongLong(offset + count);
        PyObject *timestamp = PyLong_FromLongLong(ts);
        PyObject *record = record_type->tp_alloc(record_type, 5);
        if (value == NULL || off == NULL || timestamp == NULL || record == NULL) {
            Py_XDECREF(value);
            Py_XDECREF(off);
            Py_XDECREF(timestamp);
            Py_XDECREF(record);
            return NULL;
        }
        PyTuple_SET_ITEM(record, 0, off);
        PyTuple_SET_ITEM(record, 1, timestamp);
        Py_INCREF(Py_None);
        PyTuple_SET_ITEM(record, 2, Py_None);
        PyTuple_SET_ITEM(record, 3, value);
        Py_INCREF(no_headers);
        PyTuple_SET_ITEM(record, 4, no_headers);
        int failed = PyList_Append(out, record);
        Py_DECREF(record);
        if (failed) {
            return NULL;
        }
        pos = stop;
        count++;
    }
    return Py_BuildValue("nni", pos, count, status);
}

static PyMethodDef codec_methods[] = {
    {"encode_batch", encode_batch, METH_VARARGS, encode_batch_doc},
    {"decode_plain", decode_plain, METH_VARARGS, decode_plain_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef codec_module = {
    PyModuleDef_HEAD_INIT, "filechannel._codec", "The frame codec's hot loops in C (see record.py).", -1, codec_methods,
};

PyMODINIT_FUNC
PyInit__codec(void)
{
#if FC_HAVE_SSE42
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        return PyModule_Create(&codec_module);
    }
#endif
    PyErr_SetString(PyExc_ImportError, "filechannel._codec needs an x86-64 CPU with SSE4.2 (hardware CRC-32C)");
    return NULL;
}
