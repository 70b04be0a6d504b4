/* rotate(x, out, cos, sin, lead, x_strides, cos_strides, sin_strides, D, R, half, sign,
          f32, threads)

   The rotation of posenc.families.rotary.apply for float32 (f32) or bfloat16 CPU
   tensors in one pass (addresses x, out, cos, sin as ints): x and out are
   (*lead, D), out C-contiguous, x with unit stride along D and element strides
   x_strides over `lead`; row i of out (its index over `lead`, row-major) is made
   from the row of x at that index and uses the cos row at
   sum(index[d] * cos_strides[d]) of a float32 (.., R) table (each angle twice, in
   layout order) and the sin row at sum(index[d] * sin_strides[d]) of a float32
   (.., R / 2) table (one sin per pair): the strides of the tables expanded to
   `lead`, so broadcasting is free. Pairs are (k, k + R/2) when `half`, else
   (2k, 2k + 1); with s = sign * sin:
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
   split over torch's own OpenMP threads (posenc_run_jobs, team.c). */

#include "common.h"

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

/* Work units of up to `tile` rows along the innermost lead dim (seq, in the usual
   (batch, heads, seq, D) layout), ordered tile-major: a tile of the tables is read
   once from memory and then reused from cache by every head, instead of the whole
   table streaming past once per head. */
static void *rot_run(void *arg) {
    rot_t *t = (rot_t *)arg;
    if (t->populate1 > t->populate0)
        posenc_prefault(t->out + t->populate0, t->populate1 - t->populate0);
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

PyObject *posenc_rotate(PyObject *self, PyObject *args) {
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
    if (posenc_read_sizes(lead, base.lead, base.nlead, "lead") ||
        posenc_read_sizes(xstr, base.xs, base.nlead, "x_strides") ||
        posenc_read_sizes(cstr, base.cs, base.nlead, "cos_strides") ||
        posenc_read_sizes(sstr, base.ss, base.nlead, "sin_strides"))
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
    posenc_run_jobs(rot_run, jobs, threads, sizeof(rot_t));
    Py_END_ALLOW_THREADS
    free(jobs);
    Py_RETURN_NONE;
}
