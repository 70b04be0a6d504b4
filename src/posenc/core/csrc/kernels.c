/* posenc._kernels: optional compiled loops; without them numpy and torch do the same work.

   - table: the sinusoidal table loop of posenc._angles (below);
   - rotate: the float32 and bfloat16 rotary rotation of posenc.rotary.apply (further down);
   - attend: the float32 attention loop of posenc.attention (at the end).

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
   The rows are split over `threads` threads (run_jobs), the GIL released. On CPUs
   with AVX2 the float32 rows of the interleaved-pair and half layouts take a
   vector path (same operations, same order), and tables above STREAM_BYTES
   are written with non-temporal stores. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <dlfcn.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/mman.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

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

/* Runs fn(jobs[0]), ..., fn(jobs[n - 1]) (each `size` bytes) in parallel, the GIL
   already released.

   Where an OpenMP runtime is loaded already (torch's libgomp, when torch is
   imported), its thread team runs them: those are the threads torch's own
   kernels run on, and after each parallel region they spin for a while waiting
   for more work; threads of our own would share the CPUs with those spinning
   threads and measured here up to 1.4x slower. Otherwise POSIX threads, the
   caller running jobs[0]; a thread that cannot start has its job run here. */
typedef void *(*work_fn)(void *);
typedef struct {
    work_fn fn;
    char *jobs;
    size_t size;
    int n;
} team_t;

static void (*gomp_parallel)(void (*)(void *), void *, unsigned, unsigned);
static int (*omp_thread_num)(void);
static int (*omp_num_threads)(void);
static pid_t openmp_pid; /* the process that found it: a forked child has no team */

static void find_openmp(void) {
#ifdef __linux__
    static int looked = 0;
    if (looked) return;
    looked = 1;
    void *lib = dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD); /* only if loaded */
    if (lib == NULL) return;
    void *par = dlsym(lib, "GOMP_parallel"), *num = dlsym(lib, "omp_get_thread_num");
    void *team = dlsym(lib, "omp_get_num_threads");
    if (par && num && team) {
        openmp_pid = getpid();
        *(void **)&gomp_parallel = par;
        *(void **)&omp_thread_num = num;
        *(void **)&omp_num_threads = team;
    }
#endif
}

static void team_body(void *arg) {
    team_t *t = (team_t *)arg;
    /* the team may be smaller than asked (nested regions): stride over the jobs */
    for (int i = omp_thread_num(); i < t->n; i += omp_num_threads()) t->fn(t->jobs + i * t->size);
}

static void run_jobs(work_fn fn, void *jobs, int n, size_t size) {
    char *base = (char *)jobs;
    if (n > 1) find_openmp();
    /* libgomp's team does not survive fork (a DataLoader worker): threads of our own there */
    if (n > 1 && gomp_parallel != NULL && getpid() == openmp_pid) {
        team_t team = {fn, base, size, n};
        gomp_parallel(team_body, &team, (unsigned)n, 0);
        return;
    }
    pthread_t *ids = n > 1 ? (pthread_t *)calloc((size_t)n, sizeof(pthread_t)) : NULL;
    int *started = n > 1 ? (int *)calloc((size_t)n, sizeof(int)) : NULL;
    if (ids == NULL || started == NULL) { /* one job or no memory: all of them here */
        for (int i = 0; i < n; ++i) fn(base + i * size);
    } else {
        for (int i = 1; i < n; ++i) {
            started[i] = pthread_create(&ids[i], NULL, fn, base + i * size) == 0;
            if (!started[i]) fn(base + i * size);
        }
        fn(base);
        for (int i = 1; i < n; ++i)
            if (started[i]) pthread_join(ids[i], NULL);
    }
    free(ids);
    free(started);
}

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
        run_jobs(run, jobs, threads, sizeof(job_t));
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

/* ---------------------------------------------------------------------------------
   rotate(x, out, cos, sin, lead, x_strides, cos_strides, sin_strides, D, R, half, sign,
          f32, threads)

   The rotation of posenc.rotary.apply for float32 (f32) or bfloat16 CPU tensors in
   one pass (addresses x, out, cos, sin as ints): x and out are (*lead, D), out
   C-contiguous, x with unit stride along D and element strides x_strides over
   `lead`; row i of out (its index over `lead`, row-major) is made from the row
   of x at that index and uses the cos row at sum(index[d] * cos_strides[d]) of
   a float32 (.., R) table (each angle twice, in layout order) and the sin row
   at sum(index[d] * sin_strides[d]) of a float32 (.., R / 2) table (one sin per
   pair): the strides of the tables expanded to `lead`, so broadcasting is
   free. Pairs are (k, k + R/2) when `half`, else (2k, 2k + 1); with
   s = sign * sin:
       o1 = x1 c1 - x2 s,   o2 = x2 c2 + x1 s,
   in float32, each product and sum rounded (no fused multiply-add); bfloat16 x
   is widened exactly and the result rounded once, to nearest even. Channels
   R .. D - 1 are copied.

   Why it is a kernel: torch's eager ops take three passes over memory for the
   half layout (x cos, then the cross term on each half) and, for bfloat16, an
   upcast and a rounding pass besides. Here the rows are visited tile by tile
   (the cos/sin rows of a tile stay in cache for every head), an output above
   STREAM_BYTES has its pages mapped in by one madvise per thread rather than a
   fault per page and is written with non-temporal stores, and the rows are
   split over torch's own OpenMP threads (run_jobs). */

#define MAX_LEAD 8
#define TILE_TABLE_BYTES ((Py_ssize_t)64 << 10)

typedef struct {
    const char *x; /* bfloat16 or float32 (f32), like out */
    char *out;
    const float *cos, *sin;
    Py_ssize_t lead[MAX_LEAD], xs[MAX_LEAD], cs[MAX_LEAD], ss[MAX_LEAD];
    int nlead, half, f32, avx2, stream;
    Py_ssize_t D, R;
    float sign;
    Py_ssize_t populate0, populate1; /* bytes of out this thread maps in first */
    Py_ssize_t tile;       /* rows per work unit along the innermost lead dim */
    Py_ssize_t row0, row1; /* this thread's work units */
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

VECTOR_CLONES static void rot_row_f32(const rot_t *t, const float *restrict x, float *restrict o,
                                      const float *restrict c, const float *restrict s) {
    Py_ssize_t h = t->R / 2;
    float sg = t->sign;
    if (t->half) {
        for (Py_ssize_t k = 0; k < h; ++k) {
            float x1 = x[k], x2 = x[k + h], sk = sg * s[k];
            o[k] = x1 * c[k] - x2 * sk;
            o[k + h] = x2 * c[k + h] + x1 * sk;
        }
    } else {
        for (Py_ssize_t k = 0; k < h; ++k) {
            float x1 = x[2 * k], x2 = x[2 * k + 1], sk = sg * s[k];
            o[2 * k] = x1 * c[2 * k] - x2 * sk;
            o[2 * k + 1] = x2 * c[2 * k + 1] + x1 * sk;
        }
    }
    for (Py_ssize_t k = t->R; k < t->D; ++k) o[k] = x[k];
}

#ifdef HAVE_AVX2_ROW
/* Eight channels of a row as float32: float32 as is, bfloat16 widened exactly. */
__attribute__((target("avx2"))) static inline __m256 load8(const char *p, Py_ssize_t k, int f32) {
    if (f32) return _mm256_loadu_ps((const float *)p + k);
    __m128i v = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + k));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

/* Eight float32 results stored as float32, or rounded to bfloat16 as bf16_store
   does (to nearest even, NaN kept quiet); non-temporal when `stream`. */
__attribute__((target("avx2"))) static inline void store8(char *p, Py_ssize_t k, __m256 v,
                                                          int f32, int stream) {
    if (f32) {
        if (stream)
            _mm256_stream_ps((float *)p + k, v);
        else
            _mm256_storeu_ps((float *)p + k, v);
        return;
    }
    __m256i u = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    __m256i w = _mm256_blendv_epi8(rounded, quiet, nan);
    /* 32 -> 16 bits: packus works within 128-bit lanes, the permute joins them */
    __m128i h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(w, w), 0x08));
    if (stream)
        _mm_stream_si128((__m128i *)((uint16_t *)p + k), h);
    else
        _mm_storeu_si128((__m128i *)((uint16_t *)p + k), h);
}

/* A row of either layout and either dtype, eight channels per step: the same
   operations as rot_row_f32 and rot_row_bf16 (x2 * -s added is x2 * s subtracted,
   exactly). Outputs larger than a cache are written with non-temporal stores: the
   destination lines are then never read, so the rotation moves the bytes a copy
   moves. Returns 0 for rows it does not handle (the portable loops write them). */
__attribute__((target("avx2"))) static int rot_row_avx2(const rot_t *t, const char *restrict x,
                                                        char *restrict o,
                                                        const float *restrict c,
                                                        const float *restrict s) {
    Py_ssize_t R = t->R, h = R / 2, item = t->f32 ? 4 : 2;
    int f32 = t->f32;
    if (R % 16 || t->D != R) return 0;
    int stream = t->stream && !((uintptr_t)o & 31) && !((uintptr_t)(o + h * item) & 31);
    if (t->half) {
        __m256 sg = _mm256_set1_ps(t->sign);
        for (Py_ssize_t k = 0; k < h; k += 8) {
            __m256 x1 = load8(x, k, f32), x2 = load8(x, h + k, f32);
            __m256 sk = _mm256_mul_ps(sg, _mm256_loadu_ps(s + k));
            __m256 o1 = _mm256_sub_ps(_mm256_mul_ps(x1, _mm256_loadu_ps(c + k)), _mm256_mul_ps(x2, sk));
            __m256 o2 = _mm256_add_ps(_mm256_mul_ps(x2, _mm256_loadu_ps(c + h + k)), _mm256_mul_ps(x1, sk));
            store8(o, k, o1, f32, stream);
            store8(o, h + k, o2, f32, stream);
        }
        return 1;
    }
    /* interleaved: (x1, x2) pairs side by side; each sin widened to its pair, signed
       (-s for the first member, +s for the second), times the pair-swapped x */
    __m256 sg = _mm256_setr_ps(-t->sign, t->sign, -t->sign, t->sign, -t->sign, t->sign,
                               -t->sign, t->sign);
    __m256i twice = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    for (Py_ssize_t k = 0; k < R; k += 8) {
        __m256 v = load8(x, k, f32);
        __m256 sk = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(s + k / 2)), twice);
        __m256 r = _mm256_add_ps(_mm256_mul_ps(v, _mm256_loadu_ps(c + k)),
                                 _mm256_mul_ps(_mm256_permute_ps(v, 0xB1), _mm256_mul_ps(sg, sk)));
        store8(o, k, r, f32, stream);
    }
    return 1;
}
#endif

static void rot_one(const rot_t *t, Py_ssize_t xo, Py_ssize_t co, Py_ssize_t so, Py_ssize_t i) {
    Py_ssize_t item = t->f32 ? 4 : 2;
    const char *x = t->x + xo * item;
    char *o = t->out + i * t->D * item;
    const float *c = t->cos + co, *s = t->sin + so;
#ifdef HAVE_AVX2_ROW
    if (t->avx2 && rot_row_avx2(t, x, o, c, s)) return;
#endif
    if (t->f32)
        rot_row_f32(t, (const float *)x, (float *)o, c, s);
    else
        rot_row_bf16(t, (const uint16_t *)x, (uint16_t *)o, c, s);
}

/* Maps in fresh pages of [p, p + n) with one system call instead of a page fault per
   page (Linux 5.14+; elsewhere, or on failure, the first writes fault them in). */
static void prefault(char *p, Py_ssize_t n) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
    static long page = 0;
    if (page == 0) page = sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    uintptr_t b = ((uintptr_t)p + (uintptr_t)n) & ~((uintptr_t)page - 1);
    if (b > a) (void)madvise((void *)a, b - a, MADV_POPULATE_WRITE);
#else
    (void)p;
    (void)n;
#endif
}

/* Work units of up to `tile` rows along the innermost lead dim (seq, in the usual
   (batch, heads, seq, D) layout), ordered tile-major: a tile of the tables is read
   once from memory and then reused from cache by every head, instead of the whole
   table streaming past once per head. */
static void *rot_run(void *arg) {
    rot_t *t = (rot_t *)arg;
    if (t->populate1 > t->populate0)
        prefault(t->out + t->populate0, t->populate1 - t->populate0);
    int last = t->nlead - 1;
    Py_ssize_t inner = t->lead[last], outer = 1;
    for (int d = 0; d < last; ++d) outer *= t->lead[d];
    for (Py_ssize_t u = t->row0; u < t->row1; ++u) {
        Py_ssize_t b = u / outer, rest = u % outer, xo = 0, co = 0, so = 0;
        for (int d = last - 1; d >= 0; --d) {
            Py_ssize_t k = rest % t->lead[d];
            rest /= t->lead[d];
            xo += k * t->xs[d];
            co += k * t->cs[d];
            so += k * t->ss[d];
        }
        Py_ssize_t first = b * t->tile, stop = first + t->tile < inner ? first + t->tile : inner;
        for (Py_ssize_t r = first; r < stop; ++r)
            rot_one(t, xo + r * t->xs[last], co + r * t->cs[last], so + r * t->ss[last],
                    (u % outer) * inner + r);
    }
#ifdef HAVE_AVX2_ROW
    if (t->stream) _mm_sfence(); /* the streamed rows are visible before the join */
#endif
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
    int half, f32, threads;
    double sign;
    if (!PyArg_ParseTuple(args, "KKKKOOOOnnpdpi", &xp, &op, &cp, &sp, &lead, &xstr, &cstr,
                          &sstr, &D, &R, &half, &sign, &f32, &threads))
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
    base.x = (const char *)(uintptr_t)xp;
    base.out = (char *)(uintptr_t)op;
    base.f32 = f32;
#ifdef HAVE_AVX2_ROW
    base.avx2 = __builtin_cpu_supports("avx2");
#endif
    Py_ssize_t bytes = rows * D * (f32 ? 4 : 2); /* of out */
    base.stream = bytes > STREAM_BYTES;
    base.cos = (const float *)(uintptr_t)cp;
    base.sin = (const float *)(uintptr_t)sp;
    base.half = half;
    base.D = D;
    base.R = R;
    base.sign = (float)sign;
    if (rows == 0) Py_RETURN_NONE;
    /* tiles of about TILE_TABLE_BYTES of cos and sin rows */
    Py_ssize_t inner = base.lead[base.nlead - 1];
    base.tile = TILE_TABLE_BYTES / (6 * R) > 0 ? TILE_TABLE_BYTES / (6 * R) : 1;
    if (base.tile > inner) base.tile = inner;
    Py_ssize_t units = (rows / inner) * ((inner + base.tile - 1) / base.tile);
    if (threads > units) threads = (int)units;
    rot_t *jobs = (rot_t *)calloc((size_t)threads, sizeof(rot_t));
    if (jobs == NULL) return PyErr_NoMemory();
    Py_ssize_t share = (bytes + threads - 1) / threads;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t per = (units + threads - 1) / threads;
    for (int i = 0; i < threads; ++i) {
        jobs[i] = base;
        jobs[i].row0 = i * per < units ? i * per : units;
        jobs[i].row1 = (i + 1) * per < units ? (i + 1) * per : units;
        if (base.stream) { /* a large output: each thread maps in a share of it */
            jobs[i].populate0 = i * share < bytes ? i * share : bytes;
            jobs[i].populate1 = (i + 1) * share < bytes ? (i + 1) * share : bytes;
        }
    }
    run_jobs(rot_run, jobs, threads, sizeof(rot_t));
    Py_END_ALLOW_THREADS
    free(jobs);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------
   attend(q, k, v, out, lse, table, mask, sizes, q_strides, k_strides, v_strides,
          causal, scale, threads) -> bool

   Softmax attention of posenc.attention for float32 CPU tensors, flash-attention
   style: scores are made, biased, masked, exponentiated and multiplied into the
   values one block of ABQ queries by ABK keys at a time, with the running
   maximum and sum of each query rescaling what came before, so nothing
   quadratic is ever held. Addresses as ints; sizes = [B, H, HK, LQ, LK, D, DV];
   q (B, H, LQ, D), k (B, HK, LK, D), v (B, HK, LK, DV) with unit stride along
   the last dim and element strides *_strides over the first three; head h reads
   kv head h / (H / HK). out (B, H, LQ, DV) and lse (B, H, LQ) are C-contiguous:
   lse is each query's log of the sum of exp(scores), -inf where it sees no key
   (its output row is 0).

   Query i sits at key position i + LK - LQ. score(i, j) = (q_i . k_j) * scale
   + bias, bias = table[h * (LQ + LK - 1) + LK - 1 - j + i] when table is not 0:
   the (H, LQ + LK - 1) table of posenc.attention over key - query, reversed so
   that a key's row of queries reads it forwards. Keys j > i + LK - LQ are
   masked when causal; keys with mask[b * LK + j] == 0 when mask is not 0.

   Returns False (doing nothing) where it has no loop for the input: without
   AVX-512, or DV not a multiple of 16. Work units (b, h, block of queries) go
   to the threads in turn, which balances causal blocks. exp is a Cephes-style
   polynomial (within 2 ulp); masked scores, and scores more than 87 below the
   query's maximum, weigh exactly 0. */

#define ABQ 64  /* queries per unit: four vectors of 16 */
#define ABK 256 /* keys per block */

typedef struct {
    const float *q, *k, *v, *table;
    const uint8_t *mask;
    float *out, *lse;
    Py_ssize_t B, H, HK, LQ, LK, D, DV;
    Py_ssize_t qs[3], ks[3], vs[3];
    int causal;
    float scale;
    Py_ssize_t units;
    int tid, nthreads, failed;
} att_t;

#if defined(__GNUC__) && defined(__x86_64__)
#define HAVE_AVX512_ATTEND 1
#define AVX512 __attribute__((target("avx512f")))

AVX512 static inline __m512 exp512(__m512 x) {
    /* x <= 0 or -inf. Lanes below -87 give exactly 0 rather than a subnormal: a
       weight below 2**-125 of the row's largest changes nothing in float32, and
       subnormal operands slow every later multiply-add down by two orders of
       magnitude (measured: ALiBi, whose far scores are all there, ran 3x slower) */
    __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GT_OQ);
    __m512 xc = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n));
}

/* St[r][.] = k_r . Qt[., .] for R key rows and NV vectors of queries: the
   (key, query) scores of a block, queries along the vector lanes. */
#define S_TILE(R, NV)                                                                    \
    AVX512 static void s_tile_##R##_##NV(const float *const *kr, const float *Qt,       \
                                           Py_ssize_t D, float *St) {                     \
        __m512 acc[R][NV];                                                               \
        for (int r = 0; r < R; ++r)                                                      \
            for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_setzero_ps();                \
        for (Py_ssize_t d = 0; d < D; ++d) {                                             \
            __m512 qv[NV];                                                               \
            for (int c = 0; c < NV; ++c) qv[c] = _mm512_load_ps(Qt + d * ABQ + 16 * c);  \
            for (int r = 0; r < R; ++r) {                                                \
                __m512 kb = _mm512_set1_ps(kr[r][d]);                                    \
                for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_fmadd_ps(kb, qv[c], acc[r][c]); \
            }                                                                            \
        }                                                                                \
        for (int r = 0; r < R; ++r)                                                      \
            for (int c = 0; c < NV; ++c) _mm512_store_ps(St + r * ABQ + 16 * c, acc[r][c]); \
    }
S_TILE(6, 1)
S_TILE(6, 2)
S_TILE(6, 3)
S_TILE(6, 4)
S_TILE(1, 1)
S_TILE(1, 2)
S_TILE(1, 3)
S_TILE(1, 4)

typedef void (*s_tile_fn)(const float *const *, const float *, Py_ssize_t, float *);
static const s_tile_fn S6[5] = {NULL, s_tile_6_1, s_tile_6_2, s_tile_6_3, s_tile_6_4};
static const s_tile_fn S1[5] = {NULL, s_tile_1_1, s_tile_1_2, s_tile_1_3, s_tile_1_4};

/* O[i][c0 ..] += sum_j P[j][i] V_j[c0 ..] for R query rows and NC vectors of columns */
#define PV_TILE(R, NC)                                                                   \
    AVX512 static void pv_tile_##R##_##NC(const float *St, Py_ssize_t nk,               \
                                            const float *const *vr, Py_ssize_t c0,         \
                                            float *O, Py_ssize_t DV) {                    \
        __m512 acc[R][NC];                                                               \
        for (int r = 0; r < R; ++r)                                                      \
            for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_loadu_ps(O + r * DV + c0 + 16 * c); \
        for (Py_ssize_t j = 0; j < nk; ++j) {                                            \
            __m512 vv[NC];                                                               \
            for (int c = 0; c < NC; ++c) vv[c] = _mm512_loadu_ps(vr[j] + c0 + 16 * c);   \
            for (int r = 0; r < R; ++r) {                                                \
                __m512 p = _mm512_set1_ps(St[j * ABQ + r]);                              \
                for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_fmadd_ps(p, vv[c], acc[r][c]); \
            }                                                                            \
        }                                                                                \
        for (int r = 0; r < R; ++r)                                                      \
            for (int c = 0; c < NC; ++c) _mm512_storeu_ps(O + r * DV + c0 + 16 * c, acc[r][c]); \
    }
PV_TILE(4, 1)
PV_TILE(4, 2)
PV_TILE(4, 3)
PV_TILE(4, 4)
PV_TILE(1, 1)
PV_TILE(1, 2)
PV_TILE(1, 3)
PV_TILE(1, 4)

typedef void (*pv_tile_fn)(const float *, Py_ssize_t, const float *const *, Py_ssize_t, float *,
                           Py_ssize_t);
static const pv_tile_fn PV4[5] = {NULL, pv_tile_4_1, pv_tile_4_2, pv_tile_4_3, pv_tile_4_4};
static const pv_tile_fn PV1[5] = {NULL, pv_tile_1_1, pv_tile_1_2, pv_tile_1_3, pv_tile_1_4};

/* One unit: queries i0 .. i0 + nq - 1 of head h of batch b. */
AVX512 static void attend_unit(const att_t *a, Py_ssize_t b, Py_ssize_t h, Py_ssize_t i0,
                               float *Qt, float *St, float *O, float *m, float *l,
                               float *alpha, const float **rows) {
    Py_ssize_t D = a->D, DV = a->DV, LK = a->LK, LQ = a->LQ;
    Py_ssize_t nq = LQ - i0 < ABQ ? LQ - i0 : ABQ, nv = (nq + 15) / 16;
    Py_ssize_t off = LK - LQ, hk = h / (a->H / a->HK);
    const float *qb = a->q + b * a->qs[0] + h * a->qs[1] + i0 * a->qs[2];
    const float *kb = a->k + b * a->ks[0] + hk * a->ks[1];
    const float *vb = a->v + b * a->vs[0] + hk * a->vs[1];
    const float *tb = a->table ? a->table + h * (LQ + LK - 1) : NULL;
    const uint8_t *mb = a->mask ? a->mask + b * LK : NULL;
    for (Py_ssize_t d = 0; d < D; ++d)
        for (Py_ssize_t ii = 0; ii < ABQ; ++ii) Qt[d * ABQ + ii] = ii < nq ? qb[ii * a->qs[2] + d] : 0.0f;
    for (Py_ssize_t ii = 0; ii < ABQ; ++ii) {
        m[ii] = -INFINITY;
        l[ii] = 0.0f;
    }
    memset(O, 0, sizeof(float) * (size_t)(ABQ * DV));
    Py_ssize_t kend = LK;
    if (a->causal && i0 + nq + off < kend) kend = i0 + nq + off;
    __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 scale = _mm512_set1_ps(a->scale), ninf = _mm512_set1_ps(-INFINITY);
    for (Py_ssize_t j0 = 0; j0 < kend; j0 += ABK) {
        Py_ssize_t nk = kend - j0 < ABK ? kend - j0 : ABK, jj = 0;
        for (; jj + 6 <= nk; jj += 6) {
            for (int r = 0; r < 6; ++r) rows[r] = kb + (j0 + jj + r) * a->ks[2];
            S6[nv](rows, Qt, D, St + jj * ABQ);
        }
        for (; jj < nk; ++jj) {
            rows[0] = kb + (j0 + jj) * a->ks[2];
            S1[nv](rows, Qt, D, St + jj * ABQ);
        }
        /* scale, bias, mask; the maximum of each query over this block */
        __m512 cmax[4] = {ninf, ninf, ninf, ninf};
        for (jj = 0; jj < nk; ++jj) {
            Py_ssize_t j = j0 + jj, t = j - i0 - off; /* queries ii < t may not see key j */
            int dead = mb != NULL && mb[j] == 0;
            for (Py_ssize_t c = 0; c < nv; ++c) {
                float *sp = St + jj * ABQ + 16 * c;
                __m512 s = _mm512_mul_ps(_mm512_load_ps(sp), scale);
                __mmask16 cols = (__mmask16)(nq - 16 * c >= 16 ? 0xffff : (1u << (nq - 16 * c)) - 1);
                if (tb) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(cols, tb + LK - 1 - j + i0 + 16 * c));
                __mmask16 keep = dead ? 0 : cols;
                if (a->causal && t > 16 * c)
                    keep &= _mm512_cmp_epi32_mask(_mm512_add_epi32(iota, _mm512_set1_epi32((int)(16 * c))),
                                                  _mm512_set1_epi32((int)t), _MM_CMPINT_NLT);
                s = _mm512_mask_mov_ps(ninf, keep, s);
                _mm512_store_ps(sp, s);
                cmax[c] = _mm512_max_ps(cmax[c], s);
            }
        }
        __m512 msafe[4], lsum[4];
        for (Py_ssize_t c = 0; c < nv; ++c) {
            __m512 mold = _mm512_load_ps(m + 16 * c), mnew = _mm512_max_ps(mold, cmax[c]);
            __mmask16 finite = _mm512_cmp_ps_mask(mnew, ninf, _CMP_NEQ_OQ);
            msafe[c] = _mm512_maskz_mov_ps(finite, mnew);
            _mm512_store_ps(alpha + 16 * c, exp512(_mm512_sub_ps(mold, msafe[c])));
            _mm512_store_ps(m + 16 * c, mnew);
            lsum[c] = _mm512_setzero_ps();
        }
        for (jj = 0; jj < nk; ++jj)
            for (Py_ssize_t c = 0; c < nv; ++c) {
                float *sp = St + jj * ABQ + 16 * c;
                __m512 p = exp512(_mm512_sub_ps(_mm512_load_ps(sp), msafe[c]));
                _mm512_store_ps(sp, p);
                lsum[c] = _mm512_add_ps(lsum[c], p);
            }
        for (Py_ssize_t c = 0; c < nv; ++c) {
            __m512 al = _mm512_load_ps(alpha + 16 * c);
            _mm512_store_ps(l + 16 * c, _mm512_fmadd_ps(_mm512_load_ps(l + 16 * c), al, lsum[c]));
        }
        for (Py_ssize_t ii = 0; ii < nq; ++ii)
            if (alpha[ii] != 1.0f) {
                __m512 al = _mm512_set1_ps(alpha[ii]);
                for (Py_ssize_t c = 0; c < DV; c += 16)
                    _mm512_storeu_ps(O + ii * DV + c, _mm512_mul_ps(_mm512_loadu_ps(O + ii * DV + c), al));
            }
        /* O += P V */
        for (jj = 0; jj < nk; ++jj) rows[jj] = vb + (j0 + jj) * a->vs[2];
        for (Py_ssize_t c0 = 0; c0 < DV; c0 += 64) {
            Py_ssize_t nc = (DV - c0) / 16 < 4 ? (DV - c0) / 16 : 4, ii = 0;
            for (; ii + 4 <= nq; ii += 4) PV4[nc](St + ii, nk, rows, c0, O + ii * DV, DV);
            for (; ii < nq; ++ii) PV1[nc](St + ii, nk, rows, c0, O + ii * DV, DV);
        }
    }
    float *ob = a->out + ((b * a->H + h) * LQ + i0) * DV;
    float *lb = a->lse + (b * a->H + h) * LQ + i0;
    for (Py_ssize_t ii = 0; ii < nq; ++ii) {
        float inv = l[ii] > 0.0f ? 1.0f / l[ii] : 0.0f;
        __m512 iv = _mm512_set1_ps(inv);
        for (Py_ssize_t c = 0; c < DV; c += 16)
            _mm512_storeu_ps(ob + ii * DV + c, _mm512_mul_ps(_mm512_loadu_ps(O + ii * DV + c), iv));
        lb[ii] = l[ii] > 0.0f ? m[ii] + logf(l[ii]) : -INFINITY;
    }
}

static void *attend_run(void *arg) {
    att_t *a = (att_t *)arg;
    size_t qt = sizeof(float) * (size_t)(a->D * ABQ), st = sizeof(float) * ABK * ABQ;
    size_t o = sizeof(float) * (size_t)(ABQ * a->DV), small = sizeof(float) * ABQ;
    char *buf = NULL;
    if (posix_memalign((void **)&buf, 64, qt + st + o + 3 * small + sizeof(float *) * ABK)) {
        a->failed = 1;
        return NULL;
    }
    float *Qt = (float *)buf, *St = (float *)(buf + qt), *O = (float *)(buf + qt + st);
    float *m = (float *)(buf + qt + st + o), *l = m + ABQ, *alpha = l + ABQ;
    const float **rows = (const float **)(alpha + ABQ);
    Py_ssize_t blocks = (a->LQ + ABQ - 1) / ABQ;
    for (Py_ssize_t u = a->tid; u < a->units; u += a->nthreads) {
        Py_ssize_t qb = u % blocks, bh = u / blocks;
        attend_unit(a, bh / a->H, bh % a->H, qb * ABQ, Qt, St, O, m, l, alpha, rows);
    }
    free(buf);
    return NULL;
}
#endif

static PyObject *attend(PyObject *self, PyObject *args) {
    unsigned long long qp, kp, vp, op, lp, tp, mp;
    PyObject *sizes, *qstr, *kstr, *vstr;
    int causal, threads;
    double scale;
    if (!PyArg_ParseTuple(args, "KKKKKKKOOOOpdi", &qp, &kp, &vp, &op, &lp, &tp, &mp, &sizes,
                          &qstr, &kstr, &vstr, &causal, &scale, &threads))
        return NULL;
    att_t base;
    memset(&base, 0, sizeof base);
    Py_ssize_t sz[7];
    if (read_sizes(sizes, sz, 7, "sizes") || read_sizes(qstr, base.qs, 3, "q_strides") ||
        read_sizes(kstr, base.ks, 3, "k_strides") || read_sizes(vstr, base.vs, 3, "v_strides"))
        return NULL;
    base.B = sz[0], base.H = sz[1], base.HK = sz[2], base.LQ = sz[3], base.LK = sz[4];
    base.D = sz[5], base.DV = sz[6];
    for (int i = 0; i < 7; ++i)
        if (sz[i] < 1) {
            PyErr_SetString(PyExc_ValueError, "attend: sizes must be >= 1");
            return NULL;
        }
    if (base.H % base.HK || base.LQ > base.LK || threads < 1) {
        PyErr_SetString(PyExc_ValueError, "attend: unsupported heads, lengths or threads");
        return NULL;
    }
#ifdef HAVE_AVX512_ATTEND
    if (!__builtin_cpu_supports("avx512f") || base.DV % 16) Py_RETURN_FALSE;
    base.q = (const float *)(uintptr_t)qp;
    base.k = (const float *)(uintptr_t)kp;
    base.v = (const float *)(uintptr_t)vp;
    base.out = (float *)(uintptr_t)op;
    base.lse = (float *)(uintptr_t)lp;
    base.table = (const float *)(uintptr_t)tp;
    base.mask = (const uint8_t *)(uintptr_t)mp;
    base.causal = causal;
    base.scale = (float)scale;
    base.units = base.B * base.H * ((base.LQ + ABQ - 1) / ABQ);
    if (threads > base.units) threads = (int)base.units;
    att_t *jobs = (att_t *)calloc((size_t)threads, sizeof(att_t));
    if (jobs == NULL) return PyErr_NoMemory();
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < threads; ++i) {
        jobs[i] = base;
        jobs[i].tid = i;
        jobs[i].nthreads = threads;
    }
    run_jobs(attend_run, jobs, threads, sizeof(att_t));
    for (int i = 0; i < threads; ++i) failed |= jobs[i].failed;
    Py_END_ALLOW_THREADS
    free(jobs);
    if (failed) return PyErr_NoMemory();
    Py_RETURN_TRUE;
#else
    (void)qp, (void)kp, (void)vp, (void)op, (void)lp, (void)tp, (void)mp, (void)causal,
        (void)scale;
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
    {"table", table, METH_VARARGS, "The fused table loop (see the module source)."},
    {"rotate", rotate, METH_VARARGS, "The fused rotary rotation (see the module source)."},
    {"attend", attend, METH_VARARGS, "Flash attention with a relative bias (see the module source)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "posenc._kernels",
                                    "Optional compiled loops of posenc._angles.", -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
