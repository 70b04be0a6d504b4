/* attend(q, k, v, out, lse, table, mask, sizes, q_strides, k_strides, v_strides,
          causal, scale, threads) -> bool

   Softmax attention of posenc.integration.attention for float32 CPU tensors,
   flash-attention style: scores are made, biased, masked, exponentiated and multiplied into the
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
   the (H, LQ + LK - 1) table of posenc.integration.attention over key - query,
   reversed so that a key's row of queries reads it forwards. Keys j > i + LK - LQ are
   masked when causal; keys with mask[b * LK + j] == 0 when mask is not 0.

   Returns False (doing nothing) where it has no loop for the input: without
   AVX-512, or DV not a multiple of 16. Work units (b, h, block of queries) go
   to the threads in turn, which balances causal blocks. exp is a Cephes-style
   polynomial (within 2 ulp); masked scores, and scores more than 87 below the
   query's maximum, weigh exactly 0. A NaN score weighs NaN, as does a +inf one
   (inf - inf), so the query's output row and lse are NaN, as softmax gives (a
   -inf score weighs 0); only a query that sees no key gets 0. */

#include "common.h"

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
    /* x <= 0, -inf or NaN. Lanes below -87 give exactly 0 rather than a subnormal: a
       weight below 2**-125 of the row's largest changes nothing in float32, and
       subnormal operands slow every later multiply-add down by two orders of
       magnitude (measured: ALiBi, whose far scores are all there, ran 3x slower).
       NaN lanes stay live and NaN: unordered compares true (NLE_UQ), and max_ps
       returns its second operand when either is NaN */
    __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_NLE_UQ);
    __m512 xc = _mm512_max_ps(_mm512_set1_ps(-87.0f), x);
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
        /* l is 0 only for a query that sees no key (a live key's weight is at least
           exp(0) = 1 against the maximum); a NaN l stays NaN */
        int none = l[ii] == 0.0f;
        __m512 iv = _mm512_set1_ps(none ? 0.0f : 1.0f / l[ii]);
        for (Py_ssize_t c = 0; c < DV; c += 16)
            _mm512_storeu_ps(ob + ii * DV + c, _mm512_mul_ps(_mm512_loadu_ps(O + ii * DV + c), iv));
        lb[ii] = none ? -INFINITY : m[ii] + logf(l[ii]);
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

PyObject *posenc_attend(PyObject *self, PyObject *args) {
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
    if (posenc_read_sizes(sizes, sz, 7, "sizes") ||
        posenc_read_sizes(qstr, base.qs, 3, "q_strides") ||
        posenc_read_sizes(kstr, base.ks, 3, "k_strides") ||
        posenc_read_sizes(vstr, base.vs, 3, "v_strides"))
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
    posenc_run_jobs(attend_run, jobs, threads, sizeof(att_t));
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
