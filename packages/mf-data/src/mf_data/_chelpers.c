/* The index-building hot loops of mf_data.helpers, compiled.

   Megatron-Core runs these loops as C++ (helpers.cpp); mf_data has exact numpy versions too
   (used when this extension was not built). Each function here fills arrays that the Python
   wrapper allocated and checked, through the buffer protocol (no numpy headers needed to
   build), and releases the GIL while it runs.

   Exactness: the blending error is `w * double(max(s, 1)) - double(count)` as in Megatron, with
   the first maximum winning. Build with floating-point contraction off (setup.py passes
   -ffp-contract=off): a fused multiply-subtract rounds once instead of twice and would pick a
   different dataset on near ties.

   Speed: the loops are Megatron's, rearranged so that the common case has no data-dependent
   branch (a mispredicted branch per sample is most of the C++ loops' time): the greedy keeps its
   counts in registers for blends of up to 5 datasets and selects with conditional moves; the sample walk
   writes each document's candidate row unconditionally and advances by a 0/1 step. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* The struct-module kind of a buffer's items: 'i' signed integer, 'f' floating point, '?' other. */
static char format_kind(const char *format) {
    if (format == NULL) {
        return '?'; /* NULL under PyBUF_FORMAT means unsigned bytes: never what these loops take */
    }
    while (*format == '@' || *format == '=' || *format == '<' || *format == '>' || *format == '!') {
        ++format;
    }
    if (format[0] == '\0' || format[1] != '\0') {
        return '?';
    }
    switch (format[0]) {
        case 'h': case 'i': case 'l': case 'q': case 'n': return 'i';
        case 'f': case 'd': return 'f';
        default: return '?';
    }
}

/* A C-contiguous buffer of `itemsize`-byte items of `kind` ('i' or 'f'); writable when asked. */
static int get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, char kind, int writable, const char *what) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0) {
        return -1;
    }
    if (view->itemsize != itemsize || format_kind(view->format) != kind) {
        PyErr_Format(PyExc_TypeError, "%s: expected %zd-byte %s items, got format '%s'", what, itemsize,
                     kind == 'i' ? "signed integer" : "floating-point", view->format ? view->format : "B");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* ---- sample index ------------------------------------------------------------------------ */

/* Row i (1-based) of the sample index is (k, i * seq - begin_k) for the first document position
   k whose end reaches i * seq + extra; rows past the last document (only a kept partial last
   sample) get (n_docs - 1, size of the last document - extra). Row 0 is (0, 0). */
#define SAMPLE_IDX_BODY(T)                                                                         \
    do {                                                                                           \
        T *row = (T *)out;                                                                         \
        int64_t i = 1, end = 0, start = seq, target = seq + extra;                                 \
        row[0] = 0;                                                                                \
        row[1] = 0;                                                                                \
        for (int64_t k = 0; k < n_docs && i <= num_samples; ++k) {                                 \
            int64_t begin = end;                                                                   \
            end += sizes[docs[k]];                                                                 \
            /* Speculative row: kept only when sample i ends in this document. */                  \
            row[2 * i] = (T)k;                                                                     \
            row[2 * i + 1] = (T)(start - begin);                                                   \
            int64_t hit = target <= end;                                                           \
            i += hit;                                                                              \
            start += hit * seq;                                                                    \
            target += hit * seq;                                                                   \
            while (target <= end && i <= num_samples) { /* a document holding more sample ends */ \
                row[2 * i] = (T)k;                                                                 \
                row[2 * i + 1] = (T)(start - begin);                                               \
                ++i;                                                                               \
                start += seq;                                                                      \
                target += seq;                                                                     \
            }                                                                                      \
        }                                                                                          \
        for (; i <= num_samples; ++i) {                                                            \
            row[2 * i] = (T)(n_docs - 1);                                                          \
            row[2 * i + 1] = (T)(last_size - extra);                                               \
        }                                                                                          \
    } while (0)

static PyObject *sample_idx(PyObject *self, PyObject *args) {
    PyObject *sizes_obj, *docs_obj, *out_obj;
    long long seq_ll, num_samples_ll, extra_ll;
    if (!PyArg_ParseTuple(args, "OOLLLO", &sizes_obj, &docs_obj, &seq_ll, &num_samples_ll, &extra_ll, &out_obj)) {
        return NULL;
    }
    Py_buffer sizes_view, docs_view, out_view;
    if (get_buffer(sizes_obj, &sizes_view, 4, 'i', 0, "sizes") != 0) {
        return NULL;
    }
    if (get_buffer(docs_obj, &docs_view, 4, 'i', 0, "document_indices") != 0) {
        PyBuffer_Release(&sizes_view);
        return NULL;
    }
    if (PyObject_GetBuffer(out_obj, &out_view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) != 0) {
        PyBuffer_Release(&sizes_view);
        PyBuffer_Release(&docs_view);
        return NULL;
    }
    if (format_kind(out_view.format) != 'i') {
        PyErr_SetString(PyExc_TypeError, "out: expected signed integers");
        PyBuffer_Release(&out_view);
        PyBuffer_Release(&sizes_view);
        PyBuffer_Release(&docs_view);
        return NULL;
    }
    const int32_t *sizes = (const int32_t *)sizes_view.buf;
    const int32_t *docs = (const int32_t *)docs_view.buf;
    const int64_t n_sizes = sizes_view.len / 4, n_docs = docs_view.len / 4;
    const int64_t seq = seq_ll, num_samples = num_samples_ll, extra = extra_ll;
    void *out = out_view.buf;
    const Py_ssize_t itemsize = out_view.itemsize;
    const char *error = NULL;
    if (seq < 1 || num_samples < 0 || (extra != 0 && extra != 1)) {
        error = "seq must be >= 1, num_samples >= 0 and extra 0 or 1";
    } else if (n_docs < 1) {
        error = "document_indices is empty";
    } else if (itemsize != 4 && itemsize != 8) {
        error = "out must hold 4- or 8-byte integers";
    } else if (out_view.len != 2 * (num_samples + 1) * itemsize) {
        error = "out must have shape [num_samples + 1, 2]";
    }
    int64_t last_size = 0;
    if (error == NULL) {
        /* Every document id must index `sizes`: the loop below reads without checks. */
        for (int64_t k = 0; k < n_docs; ++k) {
            if (docs[k] < 0 || docs[k] >= n_sizes) {
                error = "document_indices holds an id outside sizes";
                break;
            }
        }
    }
    if (error == NULL) {
        last_size = sizes[docs[n_docs - 1]];
        Py_BEGIN_ALLOW_THREADS
        if (itemsize == 4) {
            SAMPLE_IDX_BODY(int32_t);
        } else {
            SAMPLE_IDX_BODY(int64_t);
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&sizes_view);
    PyBuffer_Release(&docs_view);
    PyBuffer_Release(&out_view);
    if (error != NULL) {
        PyErr_SetString(PyExc_ValueError, error);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ---- blending ---------------------------------------------------------------------------- */

/* Megatron's greedy with every dataset eligible, for a few datasets: counts and weights held in
   registers, the first maximum chosen by conditional moves (no branch to mispredict), the
   fixed-length loops unrolled. Past 5 datasets the select chain outgrows the registers and the
   general loop below is as fast. With `caps` (the exhaustive blend) it stops after the first
   pick that fills a dataset's cap: until then no dataset is excluded, so the picks are the capped
   greedy's, and `greedy_capped` continues from there. Returns the number of picks made; the
   counts are left in `c_out`. */
#define GREEDY_SMALL(N)                                                                            \
    static int64_t greedy_##N(const double *w_in, const int64_t *caps, int64_t size, int16_t *pick, \
                              int64_t *nth, double *c_out) {                                       \
        double w[N], c[N], cap[N];                                                                 \
        for (int d = 0; d < N; ++d) {                                                              \
            w[d] = w_in[d];                                                                        \
            c[d] = 0.0;                                                                            \
            cap[d] = caps != NULL ? (double)caps[d] : INFINITY;                                    \
        }                                                                                          \
        int64_t s = 0;                                                                             \
        while (s < size) {                                                                         \
            double sd = s > 1 ? (double)s : 1.0;                                                   \
            int best = 0;                                                                          \
            double best_err = w[0] * sd - c[0];                                                    \
            _Pragma("GCC unroll 8") for (int d = 1; d < N; ++d) {                                  \
                double err = w[d] * sd - c[d];                                                     \
                int more = err > best_err;                                                         \
                best = more ? d : best;                                                            \
                best_err = more ? err : best_err;                                                  \
            }                                                                                      \
            double count = c[0], limit = cap[0];                                                   \
            _Pragma("GCC unroll 8") for (int d = 0; d < N; ++d) {                                  \
                count = d == best ? c[d] : count;                                                  \
                limit = d == best ? cap[d] : limit;                                                \
                c[d] += d == best ? 1.0 : 0.0;                                                     \
            }                                                                                      \
            pick[s] = (int16_t)best;                                                               \
            nth[s] = (int64_t)count;                                                               \
            ++s;                                                                                   \
            if (count + 1.0 >= limit) {                                                            \
                break; /* a dataset is full: the capped loop takes over */                         \
            }                                                                                      \
        }                                                                                          \
        for (int d = 0; d < N; ++d) {                                                              \
            c_out[d] = c[d];                                                                       \
        }                                                                                          \
        return s;                                                                                  \
    }

GREEDY_SMALL(2)
GREEDY_SMALL(3)
GREEDY_SMALL(4)
GREEDY_SMALL(5)

/* Any number of datasets: the same conditional-move selection over a counts array. */
static void greedy_general(const double *w, int nd, int64_t size, int16_t *pick, int64_t *nth, double *c) {
    for (int d = 0; d < nd; ++d) {
        c[d] = 0.0;
    }
    for (int64_t s = 0; s < size; ++s) {
        double sd = s > 1 ? (double)s : 1.0;
        int best = 0;
        double best_err = w[0] * sd - c[0];
        for (int d = 1; d < nd; ++d) {
            double err = w[d] * sd - c[d];
            int more = err > best_err;
            best = more ? d : best;
            best_err = more ? err : best_err;
        }
        pick[s] = (int16_t)best;
        nth[s] = (int64_t)c[best];
        c[best] += 1.0;
    }
}

/* The exhaustive blend: dataset d is drawn exactly caps[d] times. A capped-out dataset gets an
   error of -inf, so it is never chosen, as Megatron drops it from its set of unspent datasets.
   Counts stay exact in doubles (far below 2**53); picks start at `s0` from the counts in `c`.
   Returns 0, or -1 when every dataset is spent before `size` picks. */
static int greedy_capped(const double *w, const int64_t *caps, int nd, int64_t s0, int64_t size, int16_t *pick,
                         int64_t *nth, double *c) {
    for (int64_t s = s0; s < size; ++s) {
        double sd = s > 1 ? (double)s : 1.0;
        int best = -1;
        double best_err = -INFINITY;
        for (int d = 0; d < nd; ++d) {
            double err = c[d] >= (double)caps[d] ? -INFINITY : w[d] * sd - c[d];
            int more = err > best_err;
            best = more ? d : best;
            best_err = more ? err : best_err;
        }
        if (best < 0) {
            return -1;
        }
        pick[s] = (int16_t)best;
        nth[s] = (int64_t)c[best];
        c[best] += 1.0;
    }
    return 0;
}

static PyObject *blending(PyObject *self, PyObject *args) {
    PyObject *w_obj, *caps_obj, *pick_obj, *nth_obj;
    if (!PyArg_ParseTuple(args, "OOOO", &w_obj, &caps_obj, &pick_obj, &nth_obj)) {
        return NULL;
    }
    Py_buffer w_view, caps_view, pick_view, nth_view;
    int have_caps = caps_obj != Py_None;
    if (get_buffer(w_obj, &w_view, 8, 'f', 0, "weights") != 0) {
        return NULL;
    }
    if (have_caps && get_buffer(caps_obj, &caps_view, 8, 'i', 0, "caps") != 0) {
        PyBuffer_Release(&w_view);
        return NULL;
    }
    if (get_buffer(pick_obj, &pick_view, 2, 'i', 1, "dataset_index") != 0) {
        PyBuffer_Release(&w_view);
        if (have_caps) PyBuffer_Release(&caps_view);
        return NULL;
    }
    if (get_buffer(nth_obj, &nth_view, 8, 'i', 1, "dataset_sample_index") != 0) {
        PyBuffer_Release(&w_view);
        if (have_caps) PyBuffer_Release(&caps_view);
        PyBuffer_Release(&pick_view);
        return NULL;
    }
    const int64_t nd = w_view.len / 8, size = pick_view.len / 2;
    const char *error = NULL;
    double *counts = NULL;
    if (nd < 1 || nd > 32767) {
        error = "need between 1 and 32767 datasets";
    } else if (nth_view.len / 8 != size) {
        error = "dataset_index and dataset_sample_index differ in length";
    } else if (have_caps && caps_view.len / 8 != nd) {
        error = "caps must have one entry per dataset";
    } else if ((counts = PyMem_RawMalloc(sizeof(double) * (size_t)nd)) == NULL) {
        PyBuffer_Release(&w_view);
        if (have_caps) PyBuffer_Release(&caps_view);
        PyBuffer_Release(&pick_view);
        PyBuffer_Release(&nth_view);
        return PyErr_NoMemory();
    }
    int status = 0;
    if (error == NULL) {
        const double *w = (const double *)w_view.buf;
        const int64_t *caps = have_caps ? (const int64_t *)caps_view.buf : NULL;
        int16_t *pick = (int16_t *)pick_view.buf;
        int64_t *nth = (int64_t *)nth_view.buf;
        Py_BEGIN_ALLOW_THREADS
        int64_t done = 0;
        int spent_at_start = 0; /* a zero cap: excluded from the first pick on, the capped loop's job */
        for (int64_t d = 0; caps != NULL && d < nd; ++d) {
            spent_at_start |= caps[d] <= 0;
        }
        if (nd >= 2 && nd <= 5 && !spent_at_start) {
            switch (nd) {
                case 2: done = greedy_2(w, caps, size, pick, nth, counts); break;
                case 3: done = greedy_3(w, caps, size, pick, nth, counts); break;
                case 4: done = greedy_4(w, caps, size, pick, nth, counts); break;
                default: done = greedy_5(w, caps, size, pick, nth, counts); break;
            }
        } else if (caps == NULL) {
            greedy_general(w, (int)nd, size, pick, nth, counts);
            done = size;
        } else {
            for (int64_t d = 0; d < nd; ++d) {
                counts[d] = 0.0;
            }
        }
        if (done < size) {
            status = greedy_capped(w, caps, (int)nd, done, size, pick, nth, counts);
        }
        Py_END_ALLOW_THREADS
        if (status != 0) {
            error = "every dataset reached its cap before the blend was full";
        }
    }
    PyMem_RawFree(counts);
    PyBuffer_Release(&w_view);
    if (have_caps) PyBuffer_Release(&caps_view);
    PyBuffer_Release(&pick_view);
    PyBuffer_Release(&nth_view);
    if (error != NULL) {
        PyErr_SetString(PyExc_ValueError, error);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"sample_idx", sample_idx, METH_VARARGS,
     "sample_idx(sizes int32, document_indices int32, seq, num_samples, extra, out [n+1, 2] int32|int64)"},
    {"blending", blending, METH_VARARGS,
     "blending(weights f64, caps int64 | None, dataset_index int16 out, dataset_sample_index int64 out)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_chelpers", NULL, -1, methods};

PyMODINIT_FUNC PyInit__chelpers(void) { return PyModule_Create(&module); }
