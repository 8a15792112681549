/* Blocks of compressed segments read and decompressed on threads that never take the
 * GIL (filechannel/engine/readahead.py says when and why; compressed.CompressedSegment.read_block
 * is the Python reference of one job).
 *
 * python-zstandard releases the GIL while it decompresses, but a Python thread needs it
 * back between blocks, and the reader holds it while it decodes: measured, Python
 * readahead threads ran no faster than the reader alone. Here a job is a C struct: the
 * submitting thread (holding the GIL) gives it a buffer the block decompresses into; a
 * worker preads the compressed block (or takes the bytes a tier-2 read fetched:
 * submit_bytes) and decompresses it with no Python call; the
 * reader's result() waits with the GIL released and returns a memoryview of the job. A
 * job still queued when its result is wanted is taken back and run by the caller, also
 * without the GIL, and a caller whose job a worker is running runs the next queued ones
 * meanwhile (finish() says why). Buffers go back to a small free list when the job is
 * freed: fresh ones cost a page fault per 4 KiB at every block, glibc having given the
 * memory of the last ones back to the kernel (10,000 more faults per 115 MB read than a
 * raw read).
 *
 * libzstd is loaded at import with dlopen (its header is often not installed; the five
 * functions used are its stable API since 1.0). Without it, `available` is False and
 * readahead.py reads blocks with python-zstandard on the reader's thread.
 *
 * Workers start on the first job in a process and live as long as it; a forked child
 * starts its own, and a job its parent had queued runs in the child on result().
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

typedef struct ZSTD_DCtx_s ZSTD_DCtx;
static ZSTD_DCtx *(*zstd_create)(void);
static size_t (*zstd_free)(ZSTD_DCtx *);
static size_t (*zstd_decompress)(ZSTD_DCtx *, void *, size_t, const void *, size_t);
static unsigned (*zstd_is_error)(size_t);
static const char *(*zstd_error_name)(size_t);

enum { QUEUED, RUNNING, DONE, CANCELLED };

typedef struct Job {
    PyObject_HEAD
    struct Job *next; /* in the queue, while QUEUED */
    int state;        /* guarded by lock */
    pid_t pid;        /* the process that queued it */
    int fd;            /* -1 for a job over bytes already fetched (src) */
    long long position;
    char *src;         /* a copy of the fetched compressed block (tier-2), or NULL: freed by
                          whoever runs the job as soon as it is decompressed, so a block
                          fetched ahead holds its compressed bytes only until then, not for
                          as long as its result lives (a cached block) */
    Py_ssize_t length, raw_length;
    char *buf;         /* raw_length bytes (cap allocated), written by whoever runs the job */
    size_t cap;
    int ready;         /* result() succeeded: the buffer may be exported */
    int err;           /* errno of a failed pread */
    int short_read;    /* the file ended inside the block */
    const char *zerr;  /* libzstd's error name (a static string) */
    Py_ssize_t got;    /* bytes decompressed */
} Job;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER; /* a job was queued */
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER; /* a job finished */
static Job *head, *tail;
static pid_t workers_pid; /* the process whose workers are running; 0 for none */
static int n_workers = 2;
static pthread_key_t state_key; /* each thread's ThreadState */

/* Buffers of freed jobs, taken and given back with the GIL held. */
#define POOL_MAX 16
#define POOL_KEEP_MAX ((size_t)8 << 20) /* larger buffers are freed, not kept */
/* Capacities are whole pages, and a pooled buffer is reused only for a block within an eighth
 * of its size: a tier-2 block lives on in the cache, which counts its length, so a buffer much
 * larger than its block is memory the cache's bound does not see (64 KiB rounding made a
 * 256 KiB + 188 B block take 320 KiB: the cache held 25% more than it counted). */
#define POOL_ROUND ((size_t)4 << 10)
static struct {
    char *p;
    size_t cap;
} pool[POOL_MAX];
static int pooled;

static char *
take_buffer(size_t need, size_t *cap)
{
    for (int i = pooled - 1; i >= 0; i--) {
        if (pool[i].cap >= need && pool[i].cap - need <= need / 8 + POOL_ROUND) {
            char *p = pool[i].p;
            *cap = pool[i].cap;
            pool[i] = pool[--pooled];
            return p;
        }
    }
    *cap = (need + POOL_ROUND - 1) / POOL_ROUND * POOL_ROUND;
    return malloc(*cap ? *cap : 1);
}

static void
give_buffer(char *p, size_t cap)
{
    if (pooled < POOL_MAX && cap <= POOL_KEEP_MAX) {
        pool[pooled].p = p;
        pool[pooled].cap = cap;
        pooled++;
    } else {
        free(p);
    }
}
static int usable;              /* libzstd loaded and the key made */

/* What a thread that runs jobs keeps between them: its decompression context and the
 * buffer compressed blocks are read into (a malloc per block cost page faults, glibc
 * giving the memory back to the kernel between blocks). */
typedef struct {
    ZSTD_DCtx *dctx;
    char *in;
    size_t in_cap;
} ThreadState;

static void
free_thread_state(void *p)
{
    ThreadState *ts = p;
    zstd_free(ts->dctx);
    free(ts->in);
    free(ts);
}

/* This thread's state with room for `length` compressed bytes; NULL when out of memory. */
static ThreadState *
thread_state(size_t length)
{
    ThreadState *ts = pthread_getspecific(state_key);
    if (ts == NULL) {
        if ((ts = calloc(1, sizeof(*ts))) == NULL || (ts->dctx = zstd_create()) == NULL) {
            free(ts);
            return NULL;
        }
        pthread_setspecific(state_key, ts);
    }
    if (ts->in_cap < length) {
        size_t cap = (length + POOL_ROUND - 1) / POOL_ROUND * POOL_ROUND;
        char *in = realloc(ts->in, cap);
        if (in == NULL) {
            return NULL;
        }
        ts->in = in;
        ts->in_cap = cap;
    }
    return ts;
}

/* Read the job's compressed block into `in`; 0 on success, else the job records why. */
static int
read_block(Job *j, char *in)
{
    Py_ssize_t n = 0;
    while (n < j->length) {
        ssize_t r = pread(j->fd, in + n, (size_t)(j->length - n), (off_t)(j->position + n));
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            j->err = errno;
            return -1;
        }
        if (r == 0) {
            j->short_read = 1;
            return -1;
        }
        n += r;
    }
    return 0;
}

/* One job, without the GIL: pread the compressed block (or take the bytes a tier-2 fetch
 * gave it), decompress it into j->buf. */
static void
run(Job *j)
{
    int fetched = j->src != NULL;
    ThreadState *ts = thread_state(fetched ? 0 : (size_t)j->length);
    if (ts == NULL) {
        j->err = ENOMEM;
    } else {
        const char *in = fetched ? j->src : ts->in;
        if (fetched || read_block(j, ts->in) == 0) {
            size_t got = zstd_decompress(ts->dctx, j->buf, (size_t)j->raw_length, in, (size_t)j->length);
            if (zstd_is_error(got)) {
                j->zerr = zstd_error_name(got);
            } else {
                j->got = (Py_ssize_t)got;
            }
        }
        if (ts->in_cap > POOL_KEEP_MAX) { /* a block of huge records: keep no such buffer */
            free(ts->in);
            ts->in = NULL;
            ts->in_cap = 0;
        }
    }
    if (fetched) {
        free(j->src);
        j->src = NULL;
    }
}

/* Take the first queued job and run it. Called with lock held (released while it runs). */
static void
run_first_queued(void)
{
    Job *j = head;
    head = j->next;
    if (head == NULL) {
        tail = NULL;
    }
    j->state = RUNNING;
    pthread_mutex_unlock(&lock);
    run(j);
    pthread_mutex_lock(&lock);
    j->state = DONE;
    pthread_cond_broadcast(&done_cv);
}

static void *
worker(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&lock);
    for (;;) {
        while (head == NULL) {
            pthread_cond_wait(&work_cv, &lock);
        }
        run_first_queued();
    }
    return NULL;
}

/* Called with lock held. */
static void
unlink_job(Job *j)
{
    Job **p = &head, *prev = NULL;
    while (*p != NULL && *p != j) {
        prev = *p;
        p = &(*p)->next;
    }
    if (*p == j) {
        *p = j->next;
        if (tail == j) {
            tail = prev;
        }
    }
}

/* Called with lock held; 0 on success. */
static int
start_workers(void)
{
    for (int i = 0; i < n_workers; i++) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &attr, worker, NULL);
        pthread_attr_destroy(&attr);
        if (rc != 0) {
            if (i == 0) {
                errno = rc;
                return -1;
            }
            break; /* fewer workers than asked: still correct */
        }
    }
    workers_pid = getpid();
    return 0;
}

static void
after_fork_in_child(void)
{
    pthread_mutex_init(&lock, NULL);
    pthread_cond_init(&work_cv, NULL);
    pthread_cond_init(&done_cv, NULL);
    head = tail = NULL;
    workers_pid = 0;
}

/* Run the job on this thread if it is still queued (or is a parent's job seen in a forked
 * child). While a worker runs it, run the queued jobs that come next rather than sleep:
 * the caller works as one more worker instead of idling, and is not left waiting for a
 * CPU when its job is done (with a sleeping reader and two busy workers on two CPUs, the
 * reader resumed a median 221 us after its block was ready, longer than a 256 KiB block
 * takes to decompress). Called without the GIL. */
static void
finish(Job *j)
{
    pthread_mutex_lock(&lock);
    if (j->pid != getpid()) {
        if (j->state != DONE) {
            j->state = RUNNING; /* the parent's worker does not exist here */
            pthread_mutex_unlock(&lock);
            run(j);
            pthread_mutex_lock(&lock);
            j->state = DONE;
        }
    } else if (j->state == QUEUED) {
        unlink_job(j);
        j->state = RUNNING;
        pthread_mutex_unlock(&lock);
        run(j);
        pthread_mutex_lock(&lock);
        j->state = DONE;
    } else {
        while (j->state == RUNNING) {
            if (head != NULL) {
                run_first_queued();
            } else {
                pthread_cond_wait(&done_cv, &lock);
            }
        }
    }
    pthread_mutex_unlock(&lock);
}

static PyObject *
Job_result(Job *j, PyObject *unused)
{
    (void)unused;
    if (j->state == CANCELLED) {
        PyErr_SetString(PyExc_RuntimeError, "the job was cancelled");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    finish(j);
    Py_END_ALLOW_THREADS
    if (j->err) {
        errno = j->err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (j->short_read) {
        PyErr_SetString(PyExc_ValueError, "the file ends inside the block");
        return NULL;
    }
    if (j->zerr != NULL) {
        PyErr_SetString(PyExc_ValueError, j->zerr);
        return NULL;
    }
    if (j->got != j->raw_length) {
        PyErr_Format(PyExc_ValueError, "decompressed to %zd bytes, expected %zd", j->got, j->raw_length);
        return NULL;
    }
    j->ready = 1;
    return PyMemoryView_FromObject((PyObject *)j);
}

static PyObject *
Job_cancel(Job *j, PyObject *unused)
{
    (void)unused;
    int cancelled = 0;
    pthread_mutex_lock(&lock);
    if (j->state == QUEUED && j->pid == getpid()) {
        unlink_job(j);
        j->state = CANCELLED;
        cancelled = 1;
    }
    pthread_mutex_unlock(&lock);
    return PyBool_FromLong(cancelled);
}

static PyObject *
Job_wait(Job *j, PyObject *unused)
{
    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&lock);
    while (j->state == RUNNING && j->pid == getpid()) {
        pthread_cond_wait(&done_cv, &lock);
    }
    pthread_mutex_unlock(&lock);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static void
Job_dealloc(Job *j)
{
    /* No worker may touch it afterwards: unqueue it, or wait for the one running it (a
     * worker never takes the GIL, so waiting while holding it cannot deadlock). */
    pthread_mutex_lock(&lock);
    if (j->pid == getpid()) {
        if (j->state == QUEUED) {
            unlink_job(j);
        }
        while (j->state == RUNNING) {
            pthread_cond_wait(&done_cv, &lock);
        }
    }
    pthread_mutex_unlock(&lock);
    if (j->buf != NULL) {
        give_buffer(j->buf, j->cap);
    }
    free(j->src); /* a job never run (cancelled, or dropped while queued) */
    Py_TYPE(j)->tp_free((PyObject *)j);
}

static int
Job_getbuffer(Job *j, Py_buffer *view, int flags)
{
    if (!j->ready) {
        PyErr_SetString(PyExc_BufferError, "the block has not been read yet");
        view->obj = NULL;
        return -1;
    }
    return PyBuffer_FillInfo(view, (PyObject *)j, j->buf, j->got, 1, flags);
}

static PyBufferProcs Job_as_buffer = {(getbufferproc)Job_getbuffer, NULL};

static PyMethodDef Job_methods[] = {
    {"result", (PyCFunction)Job_result, METH_NOARGS,
     "The decompressed block (a memoryview), run here if no worker has started it. Raises OSError "
     "for a failed read, ValueError for a block that does not decompress to its length."},
    {"cancel", (PyCFunction)Job_cancel, METH_NOARGS, "Unqueue the job if no worker has started it; True if it was."},
    {"wait", (PyCFunction)Job_wait, METH_NOARGS, "Wait until no worker is running the job."},
    {NULL},
};

static PyTypeObject Job_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "filechannel.engine._readahead.Job",
    .tp_basicsize = sizeof(Job),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One block read and decompressed by a worker thread.",
    .tp_dealloc = (destructor)Job_dealloc,
    .tp_methods = Job_methods,
    .tp_as_buffer = &Job_as_buffer,
};

/* A new job (not yet queued) decompressing `length` bytes into `raw_length`; NULL with an
 * exception set. Called with the GIL. */
static Job *
new_job(int fd, long long position, Py_ssize_t length, Py_ssize_t raw_length, const char *data)
{
    if (!usable) {
        PyErr_SetString(PyExc_RuntimeError, "readahead is unavailable: see unavailable_reason");
        return NULL;
    }
    if (position < 0 || length < 0 || raw_length < 0) {
        PyErr_SetString(PyExc_ValueError, "position and lengths must not be negative");
        return NULL;
    }
    Job *j = PyObject_New(Job, &Job_Type);
    if (j == NULL) {
        return NULL;
    }
    j->next = NULL;
    j->state = CANCELLED; /* until queued: dealloc then has nothing to wait for */
    j->pid = getpid();
    j->fd = fd;
    j->position = position;
    j->length = length;
    j->raw_length = raw_length;
    j->src = NULL;
    j->err = j->short_read = 0;
    j->zerr = NULL;
    j->got = 0;
    j->ready = 0;
    j->buf = take_buffer((size_t)raw_length, &j->cap);
    if (j->buf != NULL && data != NULL) {
        j->src = malloc(length ? (size_t)length : 1); /* about 1/100 of the decompression's time */
        if (j->src != NULL) {
            memcpy(j->src, data, (size_t)length);
        }
    }
    if (j->buf == NULL || (data != NULL && j->src == NULL)) {
        Py_DECREF(j);
        PyErr_NoMemory();
        return NULL;
    }
    return j;
}

/* Queue the job for the workers (starting them in this process first); steals the
 * reference to `j` on failure. */
static PyObject *
queue_job(Job *j)
{
    pthread_mutex_lock(&lock);
    if (workers_pid != j->pid && start_workers() != 0) {
        pthread_mutex_unlock(&lock);
        Py_DECREF(j);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    j->state = QUEUED;
    if (tail != NULL) {
        tail->next = j;
    } else {
        head = j;
    }
    tail = j;
    pthread_cond_signal(&work_cv);
    pthread_mutex_unlock(&lock);
    return (PyObject *)j;
}

static PyObject *
submit(PyObject *module, PyObject *args)
{
    (void)module;
    int fd;
    long long position;
    Py_ssize_t length, raw_length;
    if (!PyArg_ParseTuple(args, "iLnn", &fd, &position, &length, &raw_length)) {
        return NULL;
    }
    Job *j = new_job(fd, position, length, raw_length, NULL);
    return j == NULL ? NULL : queue_job(j);
}

static PyObject *
submit_bytes(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *src;
    Py_ssize_t raw_length;
    if (!PyArg_ParseTuple(args, "Sn", &src, &raw_length)) {
        return NULL;
    }
    Job *j = new_job(-1, 0, PyBytes_GET_SIZE(src), raw_length, PyBytes_AS_STRING(src));
    return j == NULL ? NULL : queue_job(j);
}

static PyObject *
set_threads(PyObject *module, PyObject *arg)
{
    (void)module;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (n < 1 || n > 64) {
        PyErr_SetString(PyExc_ValueError, "threads must be from 1 to 64");
        return NULL;
    }
    n_workers = (int)n; /* takes effect in a process that has not started its workers */
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"submit", submit, METH_VARARGS,
     "submit(fd, position, length, raw_length) -> Job: read `length` bytes of fd at `position` "
     "(one zstd frame) and decompress them into `raw_length` bytes, on a worker thread."},
    {"submit_bytes", submit_bytes, METH_VARARGS,
     "submit_bytes(data, raw_length) -> Job: decompress `data` (a bytes object: one zstd frame a tier-2 "
     "read fetched) into `raw_length` bytes, on a worker thread."},
    {"set_threads", set_threads, METH_O, "How many worker threads a process starts (default 2)."},
    {NULL},
};

static struct PyModuleDef readahead_module = {
    PyModuleDef_HEAD_INIT, "filechannel.engine._readahead", "Compressed blocks decompressed on threads without the GIL.", -1,
    module_methods,
};

static const char *
load_libzstd(void)
{
    static const char *names[] = {"libzstd.so.1", "libzstd.1.dylib", "libzstd.so", "libzstd.dylib"};
    void *lib = NULL;
    for (size_t i = 0; lib == NULL && i < sizeof(names) / sizeof(names[0]); i++) {
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    }
    if (lib == NULL) {
        return "libzstd was not found (install the libzstd1 package)";
    }
    *(void **)&zstd_create = dlsym(lib, "ZSTD_createDCtx");
    *(void **)&zstd_free = dlsym(lib, "ZSTD_freeDCtx");
    *(void **)&zstd_decompress = dlsym(lib, "ZSTD_decompressDCtx");
    *(void **)&zstd_is_error = dlsym(lib, "ZSTD_isError");
    *(void **)&zstd_error_name = dlsym(lib, "ZSTD_getErrorName");
    if (!zstd_create || !zstd_free || !zstd_decompress || !zstd_is_error || !zstd_error_name) {
        return "libzstd lacks a function it has had since 1.0";
    }
    return NULL;
}

PyMODINIT_FUNC
PyInit__readahead(void)
{
    if (PyType_Ready(&Job_Type) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&readahead_module);
    if (m == NULL) {
        return NULL;
    }
    const char *why = load_libzstd();
    if (why == NULL && (pthread_key_create(&state_key, free_thread_state) != 0 || pthread_atfork(NULL, NULL, after_fork_in_child) != 0)) {
        why = "could not set up its threads";
    }
    usable = why == NULL;
    if (PyModule_AddObject(m, "available", PyBool_FromLong(why == NULL)) < 0 ||
        PyModule_AddObject(m, "unavailable_reason", why ? PyUnicode_FromString(why) : Py_NewRef(Py_None)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
