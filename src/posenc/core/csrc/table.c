/* table(coarse, fine, step, out, n, m, dim, first_off, first_step, n_first,
         second_off, second_step, n_second, f64, threads)

   Row r = P * B + j (P = r // B, j = r % B) of a table is
   w = (coarse[P // m] * fine[P % m]) * step[j], complex128 arithmetic in that
   order, as posenc.core.angles.progression_blocks evaluates it in numpy. coarse
   and fine are complex128 arrays; step is (B, 2, K) float64: the real and
   imaginary planes of each step row. Built with -ffp-contract=off (no fused
   multiply-add); numpy's own vectorised loop may round a float64 product
   differently in the last bit, float32 results agree.
   Re(w) goes to out[r, first_off + k * first_step] for k < n_first and Im(w)
   to out[r, second_off + k * second_step] for k < n_second, rounded once to
   out's dtype (float32 or float64, flag f64). out is C-contiguous (n, dim).
   The rows are split over `threads` threads (posenc_run_jobs, team.c), the GIL
   released. On CPUs with AVX2 the float32 rows of the interleaved-pair and half
   layouts take a vector path (same operations, same order), and tables above
   STREAM_BYTES are written with non-temporal stores. */

#include "common.h"

typedef struct {
    const double *coarse, *fine; /* (re, im) pairs: (?, K) and (m, K) */
    const double *step;          /* planes: row j is K re, then K im */
    char *out;
    Py_ssize_t n, m, B, K, dim;
    Py_ssize_t first_off, first_step, n_first, second_off, second_step, n_second;
    int f64, avx2, stream; /* stream: non-temporal stores (tables larger than a cache) */
    Py_ssize_t block0, block1; /* blocks P of this job */
    int failed;
} job_t;

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

#ifdef HAVE_AVX2_ROW
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

PyObject *posenc_table(PyObject *self, PyObject *args) {
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
    int failed = jobs == NULL;
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
        }
        posenc_run_jobs(run, jobs, threads, sizeof(job_t));
        for (int i = 0; i < threads; ++i) failed |= jobs[i].failed;
        Py_END_ALLOW_THREADS
    }
    free(jobs);
    PyBuffer_Release(&coarse);
    PyBuffer_Release(&fine);
    PyBuffer_Release(&step);
    PyBuffer_Release(&out);
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}
