/* posenc._kernels: optional compiled loops; without them numpy and torch do the same work.

   - table: the sinusoidal table loop of posenc._angles (below);
   - rotate: the bfloat16 rotary rotation of posenc.rotary.apply (further down).

   table(coarse, fine, step, out, n, m, dim, first_off, first_step, n_first,
         second_off, second_step, n_second, f64, threads)

   Row r = P * B + j (P = r // B, j = r % B) of a table is
   w = (coarse[P // m] * fine[P % m]) * step[j], complex128 arithmetic in that
   order, as posenc._angles.progression_blocks evaluates it in numpy. coarse
   and fine are complex128 arrays; step is (B, 2, K) float64: the real and
   imaginary planes of each step row. Built with -ffp-contract=off (no fused
   multiply-add); numpy's own vectorised loop may round a float64 product
   differently in the last bit, float32 results agree.
   Re(w) goes to out[r, first_off + k * first_step] for k < n_first and Im(w)
   to out[r, second_off + k * second_step] for k < n_second, rounded once to
   out's dtype (float32 or float64, flag f64). out is C-contiguous (n, dim).
   The rows are split over `threads` POSIX threads, the GIL released. On CPUs
   with AVX2 the float32 rows of the interleaved-pair and half layouts take a
   vector path (same operations, same order), and tables above STREAM_BYTES
   are written with non-temporal stores. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const double *coarse, *fine; /* (re, im) pairs: (?, K) and (m, K) */
    const double *step;          /* planes: row j is K re, then K im */
    char *out;
    Py_ssize_t n, m, B, K, dim;
    Py_ssize_t first_off, first_step, n_first, second_off, second_step, n_second;
    int f64, avx2, stream; /* stream: non-temporal stores (tables larger than a cache) */
    Py_ssize_t block0, block1; /* blocks P of this job */
    int failed, started;
} job_t;

/* Tables larger than this are written with non-temporal stores: they cannot stay in
   cache anyway, and streaming skips reading every destination line first. */
#define STREAM_BYTES ((Py_ssize_t)16 << 20)

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* One row from the block start (sr, si) and the step (tr, ti), planes of K. */
#define ROW(T)                                                                     \
    static void row_##T(const job_t *j, T *restrict row, const double *restrict sr, \
                        const double *restrict si, const double *restrict tr,          \
                        const double *restrict ti, double *restrict re,                \
                        double *restrict im) {                                         \
        Py_ssize_t K = j->K;                                                       \
        for (Py_ssize_t k = 0; k < K; ++k) {                                       \
            re[k] = sr[k] * tr[k] - si[k] * ti[k];                                 \
            im[k] = sr[k] * ti[k] + si[k] * tr[k];                                 \
        }                                                                          \
        if (j->first_step == 2 && j->second_off == j->first_off + 1 &&             \
            j->second_step == 2 && j->n_first == j->n_second) {                    \
            T *restrict pair = row + j->first_off;                                 \
            for (Py_ssize_t k = 0; k < j->n_first; ++k) {                          \
                pair[2 * k] = (T)re[k];                                            \
                pair[2 * k + 1] = (T)im[k];                                        \
            }                                                                      \
        } else {                                                                   \
            T *a = row + j->first_off, *b = row + j->second_off;                   \
            Py_ssize_t fs = j->first_step, ss = j->second_step;                    \
            for (Py_ssize_t k = 0; k < j->n_first; ++k) a[k * fs] = (T)re[k];      \
            for (Py_ssize_t k = 0; k < j->n_second; ++k) b[k * ss] = (T)im[k];     \
        }                                                                          \
    }

VECTOR_CLONES ROW(float)
VECTOR_CLONES ROW(double)

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_AVX2_ROW 1
/* The float32 row of the two layouts that matter, four pairs per step: the same
   multiplies and adds as row_float (no FMA), kept in registers. Returns 0 for a
   placement it does not handle, which row_float then writes. */
__attribute__((target("avx2"))) static int row_float_avx2(const job_t *j, float *restrict row,
                                                           const double *restrict sr,
                                                           const double *restrict si,
                                                           const double *restrict tr,
                                                           const double *restrict ti) {
    Py_ssize_t n = j->n_first, k = 0;
    int pairs = j->first_step == 2 && j->second_step == 2 && j->second_off == j->first_off + 1;
    int planes = j->first_step == 1 && j->second_step == 1;
    if (j->n_second != n || !(pairs || planes)) return 0;
    float *a = row + j->first_off, *b = row + j->second_off;
    for (; k + 4 <= n; k += 4) {
        __m256d vsr = _mm256_loadu_pd(sr + k), vsi = _mm256_loadu_pd(si + k);
        __m256d vtr = _mm256_loadu_pd(tr + k), vti = _mm256_loadu_pd(ti + k);
        __m128 re = _mm256_cvtpd_ps(_mm256_sub_pd(_mm256_mul_pd(vsr, vtr), _mm256_mul_pd(vsi, vti)));
        __m128 im = _mm256_cvtpd_ps(_mm256_add_pd(_mm256_mul_pd(vsr, vti), _mm256_mul_pd(vsi, vtr)));
        if (pairs && j->stream && !((uintptr_t)(a + 2 * k) & 15)) {
            _mm_stream_ps(a + 2 * k, _mm_unpacklo_ps(re, im));
            _mm_stream_ps(a + 2 * k + 4, _mm_unpackhi_ps(re, im));
        } else if (pairs) {
            _mm_storeu_ps(a + 2 * k, _mm_unpacklo_ps(re, im));
            _mm_storeu_ps(a + 2 * k + 4, _mm_unpackhi_ps(re, im));
        } else if (j->stream && !((uintptr_t)(a + k) & 15) && !((uintptr_t)(b + k) & 15)) {
            _mm_stream_ps(a + k, re);
            _mm_stream_ps(b + k, im);
        } else {
            _mm_storeu_ps(a + k, re);
            _mm_storeu_ps(b + k, im);
        }
    }
    for (; k < n; ++k) {
        float re = (float)(sr[k] * tr[k] - si[k] * ti[k]);
        float im = (float)(sr[k] * ti[k] + si[k] * tr[k]);
        if (pairs) {
            a[2 * k] = re;
            a[2 * k + 1] = im;
        } else {
            a[k] = re;
            b[k] = im;
        }
    }
    return 1;
}
#endif

static void *run(void *arg) {
    job_t *j = (job_t *)arg;
    Py_ssize_t K = j->K;
    /* the block start and one row's products, as re and im planes */
    double *buf = (double *)malloc(sizeof(double) * 4 * (size_t)(K > 0 ? K : 1));
    if (buf == NULL) {
        j->failed = 1;
        return NULL;
    }
    double *sr = buf, *si = buf + K, *re = buf + 2 * K, *im = buf + 3 * K;
    for (Py_ssize_t P = j->block0; P < j->block1; ++P) {
        const double *c = j->coarse + 2 * K * (P / j->m);
        const double *f = j->fine + 2 * K * (P % j->m);
        for (Py_ssize_t k = 0; k < K; ++k) {
            double cr = c[2 * k], ci = c[2 * k + 1], fr = f[2 * k], fi = f[2 * k + 1];
            sr[k] = cr * fr - ci * fi;
            si[k] = cr * fi + ci * fr;
        }
        for (Py_ssize_t jj = 0; jj < j->B; ++jj) {
            Py_ssize_t r = P * j->B + jj;
            if (r >= j->n) break;
            const double *tr = j->step + 2 * K * jj, *ti = tr + K;
            if (j->f64) {
                row_double(j, (double *)j->out + r * j->dim, sr, si, tr, ti, re, im);
                continue;
            }
            float *row = (float *)j->out + r * j->dim;
#ifdef HAVE_AVX2_ROW
            if (j->avx2 && row_float_avx2(j, row, sr, si, tr, ti)) continue;
#endif
            row_float(j, row, sr, si, tr, ti, re, im);
        }
    }
#ifdef HAVE_AVX2_ROW
    if (j->stream) _mm_sfence(); /* the streamed rows are visible before the join */
#endif
    free(buf);
    return NULL;
}

static PyObject *table(PyObject *self, PyObject *args) {
    Py_buffer coarse, fine, step, out;
    Py_ssize_t n, m, first_off, first_step, n_first, second_off, second_step, n_second, dim;
    int f64, threads;
    if (!PyArg_ParseTuple(args, "y*y*y*w*nnnnnnnnnpi", &coarse, &fine, &step, &out, &n, &m,
                          &dim, &first_off, &first_step, &n_first, &second_off, &second_step,
                          &n_second, &f64, &threads))
        return NULL;
    Py_ssize_t K = n_first > n_second ? n_first : n_second;
    Py_ssize_t B = K ? step.len / (Py_ssize_t)(16 * K) : 0;
    Py_ssize_t blocks = B ? (n + B - 1) / B : 0;
    Py_ssize_t item = f64 ? 8 : 4;
    const char *bad = NULL;
    if (K <= 0 || B <= 0 || m <= 0 || threads < 1)
        bad = "empty tables or no threads";
    else if (fine.len < 16 * K * (blocks < m ? blocks : m) ||
             coarse.len < 16 * K * ((blocks + m - 1) / m))
        bad = "coarse or fine too short";
    else if (out.len < n * dim * item)
        bad = "out too small";
    else if (first_off < 0 || second_off < 0 || first_step < 1 || second_step < 1 ||
             first_off + (n_first - 1) * first_step >= dim ||
             (n_second && second_off + (n_second - 1) * second_step >= dim))
        bad = "channel placement outside the row";
    if (bad != NULL) {
        PyBuffer_Release(&coarse);
        PyBuffer_Release(&fine);
        PyBuffer_Release(&step);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, bad);
        return NULL;
    }
    if (threads > blocks) threads = (int)(blocks ? blocks : 1);
#ifdef HAVE_AVX2_ROW
    int avx2 = __builtin_cpu_supports("avx2");
#else
    int avx2 = 0;
#endif
    job_t *jobs = (job_t *)calloc((size_t)threads, sizeof(job_t));
    pthread_t *ids = (pthread_t *)calloc((size_t)threads, sizeof(pthread_t));
    int failed = jobs == NULL || ids == NULL;
    if (!failed) {
        Py_BEGIN_ALLOW_THREADS
        Py_ssize_t per = (blocks + threads - 1) / threads;
        for (int i = 0; i < threads; ++i) {
            job_t *j = &jobs[i];
            j->coarse = (const double *)coarse.buf;
            j->fine = (const double *)fine.buf;
            j->step = (const double *)step.buf;
            j->out = (char *)out.buf;
            j->n = n; j->m = m; j->B = B; j->K = K; j->dim = dim;
            j->first_off = first_off; j->first_step = first_step; j->n_first = n_first;
            j->second_off = second_off; j->second_step = second_step; j->n_second = n_second;
            j->f64 = f64;
            j->avx2 = avx2;
            j->stream = n * dim * item > STREAM_BYTES;
            j->block0 = i * per;
            j->block1 = (i + 1) * per < blocks ? (i + 1) * per : blocks;
            /* job 0 runs on this thread; a thread that cannot start runs here too */
            if (i > 0) {
                j->started = pthread_create(&ids[i], NULL, run, j) == 0;
                if (!j->started) run(j);
            }
        }
        run(&jobs[0]);
        for (int i = 1; i < threads; ++i)
            if (jobs[i].started) pthread_join(ids[i], NULL);
        for (int i = 0; i < threads; ++i) failed |= jobs[i].failed;
        Py_END_ALLOW_THREADS
    }
    free(jobs);
    free(ids);
    PyBuffer_Release(&coarse);
    PyBuffer_Release(&fine);
    PyBuffer_Release(&step);
    PyBuffer_Release(&out);
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------
   rotate(x, out, cos, sin, lead, x_strides, cos_strides, sin_strides, D, R, half, sign,
          threads)

   The rotation of posenc.rotary.apply for bfloat16 CPU tensors in one pass
   (addresses x, out, cos, sin as ints): x and out are (*lead, D) bfloat16, out
   C-contiguous, x with unit stride along D and element strides x_strides over
   `lead`; row i of out (its index over `lead`, row-major) is made from the row
   of x at that index and uses the cos row at sum(index[d] * cos_strides[d]) of
   a float32 (.., R) table (each angle twice, in layout order) and the sin row
   at sum(index[d] * sin_strides[d]) of a float32 (.., R / 2) table (one sin per
   pair): the strides of the tables expanded to `lead`, so broadcasting is
   free. Pairs are (k, k + R/2) when `half`, else (2k, 2k + 1); with
   s = sign * sin:
       o1 = x1 c1 - x2 s,   o2 = x2 c2 + x1 s,
   in float32 (x widened exactly), rounded once to bfloat16, to nearest even.
   Channels R .. D - 1 are copied. Rows are split over `threads` threads.
   (float32 inputs are left to torch's own kernels: measured here, they were as
   fast or faster; bfloat16 saves torch's separate upcast and rounding passes.) */

#define MAX_LEAD 8

typedef struct {
    const uint16_t *x;
    uint16_t *out;
    const float *cos, *sin;
    Py_ssize_t lead[MAX_LEAD], xs[MAX_LEAD], cs[MAX_LEAD], ss[MAX_LEAD];
    int nlead, half;
    Py_ssize_t D, R;
    float sign;
    Py_ssize_t row0, row1;
    int started;
} rot_t;

static inline float bf16_load(uint16_t v) {
    union { uint32_t u; float f; } c;
    c.u = (uint32_t)v << 16;
    return c.f;
}

static inline uint16_t bf16_store(float f) {
    union { uint32_t u; float f; } c;
    c.f = f;
    if ((c.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((c.u >> 16) | 0x40u); /* NaN */
    return (uint16_t)((c.u + 0x7fffu + ((c.u >> 16) & 1u)) >> 16);
}

VECTOR_CLONES static void rot_row_bf16(const rot_t *t, const uint16_t *restrict x,
                                       uint16_t *restrict o, const float *restrict c,
                                       const float *restrict s) {
    Py_ssize_t h = t->R / 2;
    float sg = t->sign;
    if (t->half) {
        for (Py_ssize_t k = 0; k < h; ++k) {
            float x1 = bf16_load(x[k]), x2 = bf16_load(x[k + h]), sk = sg * s[k];
            o[k] = bf16_store(x1 * c[k] - x2 * sk);
            o[k + h] = bf16_store(x2 * c[k + h] + x1 * sk);
        }
    } else {
        for (Py_ssize_t k = 0; k < h; ++k) {
            float x1 = bf16_load(x[2 * k]), x2 = bf16_load(x[2 * k + 1]), sk = sg * s[k];
            o[2 * k] = bf16_store(x1 * c[2 * k] - x2 * sk);
            o[2 * k + 1] = bf16_store(x2 * c[2 * k + 1] + x1 * sk);
        }
    }
    for (Py_ssize_t k = t->R; k < t->D; ++k) o[k] = x[k];
}

static void *rot_run(void *arg) {
    rot_t *t = (rot_t *)arg;
    /* the index of row0 over `lead`, then advanced like an odometer: no division per row */
    Py_ssize_t idx[MAX_LEAD], rest = t->row0, xo = 0, co = 0, so = 0;
    for (int d = t->nlead - 1; d >= 0; --d) {
        idx[d] = rest % t->lead[d];
        rest /= t->lead[d];
        xo += idx[d] * t->xs[d];
        co += idx[d] * t->cs[d];
        so += idx[d] * t->ss[d];
    }
    for (Py_ssize_t i = t->row0; i < t->row1; ++i) {
        if (i > t->row0) {
            for (int d = t->nlead - 1; d >= 0; --d) {
                xo += t->xs[d];
                co += t->cs[d];
                so += t->ss[d];
                if (++idx[d] < t->lead[d]) break;
                xo -= t->lead[d] * t->xs[d];
                co -= t->lead[d] * t->cs[d];
                so -= t->lead[d] * t->ss[d];
                idx[d] = 0;
            }
        }
        rot_row_bf16(t, t->x + xo, t->out + i * t->D, t->cos + co, t->sin + so);
    }
    return NULL;
}

static int read_sizes(PyObject *seq, Py_ssize_t *dst, int n, const char *name) {
    PyObject *fast = PySequence_Fast(seq, name);
    if (fast == NULL) return -1;
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "%s must have %d entries", name, n);
        return -1;
    }
    for (int d = 0; d < n; ++d) {
        dst[d] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast, d));
        if (dst[d] == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    return 0;
}

static PyObject *rotate(PyObject *self, PyObject *args) {
    unsigned long long xp, op, cp, sp;
    PyObject *lead, *xstr, *cstr, *sstr;
    Py_ssize_t D, R;
    int half, threads;
    double sign;
    if (!PyArg_ParseTuple(args, "KKKKOOOOnnpdi", &xp, &op, &cp, &sp, &lead, &xstr, &cstr,
                          &sstr, &D, &R, &half, &sign, &threads))
        return NULL;
    rot_t base;
    memset(&base, 0, sizeof base);
    Py_ssize_t nlead = PySequence_Size(lead);
    if (nlead < 0) return NULL;
    if (nlead > MAX_LEAD || R < 2 || R % 2 || R > D || threads < 1) {
        PyErr_SetString(PyExc_ValueError, "rotate: unsupported shape or rotary_dim");
        return NULL;
    }
    base.nlead = (int)nlead;
    if (read_sizes(lead, base.lead, base.nlead, "lead") ||
        read_sizes(xstr, base.xs, base.nlead, "x_strides") ||
        read_sizes(cstr, base.cs, base.nlead, "cos_strides") ||
        read_sizes(sstr, base.ss, base.nlead, "sin_strides"))
        return NULL;
    Py_ssize_t rows = 1;
    for (int d = 0; d < base.nlead; ++d) rows *= base.lead[d];
    base.x = (const uint16_t *)(uintptr_t)xp;
    base.out = (uint16_t *)(uintptr_t)op;
    base.cos = (const float *)(uintptr_t)cp;
    base.sin = (const float *)(uintptr_t)sp;
    base.half = half;
    base.D = D;
    base.R = R;
    base.sign = (float)sign;
    if (rows == 0) Py_RETURN_NONE;
    if (threads > rows) threads = (int)rows;
    rot_t *jobs = (rot_t *)calloc((size_t)threads, sizeof(rot_t));
    pthread_t *ids = (pthread_t *)calloc((size_t)threads, sizeof(pthread_t));
    if (jobs == NULL || ids == NULL) {
        free(jobs);
        free(ids);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t per = (rows + threads - 1) / threads;
    for (int i = 0; i < threads; ++i) {
        jobs[i] = base;
        jobs[i].row0 = i * per < rows ? i * per : rows;
        jobs[i].row1 = (i + 1) * per < rows ? (i + 1) * per : rows;
        if (i > 0) {
            jobs[i].started = pthread_create(&ids[i], NULL, rot_run, &jobs[i]) == 0;
            if (!jobs[i].started) rot_run(&jobs[i]);
        }
    }
    rot_run(&jobs[0]);
    for (int i = 1; i < threads; ++i)
        if (jobs[i].started) pthread_join(ids[i], NULL);
    Py_END_ALLOW_THREADS
    free(jobs);
    free(ids);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"table", table, METH_VARARGS, "The fused table loop (see the module source)."},
    {"rotate", rotate, METH_VARARGS, "The fused rotary rotation (see the module source)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "posenc._kernels",
                                    "Optional compiled loops of posenc._angles.", -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
