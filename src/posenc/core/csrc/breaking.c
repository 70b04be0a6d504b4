/* breaking(q, k, v, out, log_rem, sizes, q_strides, k_strides, v_strides,
            attend_current, scale, threads, off, docs) -> bool

   Stick-breaking attention of posenc.integration.attention.stick_breaking for
   float32 CPU tensors: with z_ij = (q_i . k_j) * scale, each key j takes sigmoid(z_ij)
   of the stick the keys nearer to query i left,

       log A_ij = log sigmoid(z_ij) - sum_{m nearer, seen} softplus(z_im),
       out_i = sum_j A_ij v_j,   log_rem_i = -sum_{j seen} softplus(z_ij),

   one unit (batch, head, block of ABQ queries) at a time: the keys are taken in
   blocks of BRK from the nearest to the farthest, their scores made by
   scores_block (queries along the lanes), and within a block key by key from the
   last, each query's running log-survival (its lane) carried from key to key, so
   nothing quadratic is held. Addresses as ints; sizes = [B, H, HK, LQ, LK, D, DV];
   q (B, H, LQ, D), k (B, HK, LK, D), v (B, HK, LK, DV) with unit stride along the
   last dim and element strides *_strides over the first three; head h reads kv
   head h / (H / HK). out (B, H, LQ, DV) and log_rem (B, H, LQ) are C-contiguous.

   Query i sits at key position i + off (LK - LQ: a KV cache holds the earlier
   keys) and sees the keys j < i + off, or j <= i + off with attend_current (its own
   key the first to break the stick); with docs = (qdoc, kdoc), int32 (B, LQ) and
   (B, LK) document numbers that never decrease along a row (packed sequences),
   only those of its own document: a block of queries then reads only the keys of
   its documents. A key a query does not see weighs 0 and leaves its survival
   alone; a query that sees no key gets out 0 and log_rem 0 (rem 1).

   softplus(z) = max(z, 0) + log1p(exp(-|z|)) and log sigmoid(z) = min(z, 0) -
   log1p(exp(-|z|)), log1p by Goldberg's log(1 + x) x / ((1 + x) - 1) (relative error a
   few ulp however small x is): both exact in sign, so log A <= 0 and exp512 never
   overflows; a weight below exp(-87) is 0, and a long sequence or a large |z| drives
   the log-survival to a large negative number, never to a NaN.

   breaking_backward(q, k, v, dout, total, dq, dk, dv, sizes, q_strides, k_strides,
                     v_strides, attend_current, scale, threads, off, docs) -> bool

   Its gradients, for the loss sum_i dout_i . out_i + drem_i rem_i, from total =
   dout . out + rem drem (B, H, LQ): with g_ij = A_ij (dout_i . v_j), beta_ij =
   sigmoid(z_ij),

       dz_ij = g_ij - beta_ij (total_i - sum_{m nearer} g_im),
       dq_i += scale dz_ij k_j,   dk_j += scale dz_ij q_i,   dv_j += A_ij dout_i,

   the same units in the same order as the forward, which recompute its weights bit
   for bit and carry the nearer keys' sum of g as the forward carries the
   log-survival. q, k, v, sizes, strides and the place of the queries as breaking
   reads them; dout (B, H, LQ, DV) and total are C-contiguous. Adds into dq (B, H,
   LQ, D), dk (B, HK, LK, D) and dv (B, HK, LK, DV), C-contiguous and zeroed: a unit
   owns its queries' dq, and dk and dv gather from every query, so each thread but
   the first adds them into zeroed buffers of its own (memory: (threads - 1) (B, HK,
   LK, D + DV) floats), summed after in the order of the threads, equal to float32
   rounding from run to run, not bit for bit.

   Both return False (doing nothing) where they have no loop for the input: without
   AVX-512, or DV (and for the backward D) not a multiple of 16. Units go to the
   threads longest first (the last blocks of queries see the most keys). */

#include "common.h"

#define BRK 64 /* keys per block: a block's scores (BRK x ABQ) stay in L1 */

typedef struct {
    team_job_t job; /* first: posenc_launch numbers the copies */
    const float *q, *k, *v;
    float *out, *lrem;         /* the forward's */
    const float *dout, *total; /* the backward's */
    float *dq, *dk, *dv;       /* dq the output; dk and dv this thread's */
    float **dks, **dvs;        /* every thread's, for the sum */
    const int32_t *qdoc, *kdoc; /* (B, LQ) and (B, LK), or 0 without documents */
    Py_ssize_t B, H, HK, LQ, LK, D, DV, off;
    Py_ssize_t qs[3], ks[3], vs[3];
    int current;
    float scale;
    Py_ssize_t units, *next; /* the next unit to take, shared */
} brk_t;

#if defined(__GNUC__) && defined(__x86_64__)
#define HAVE_AVX512_BREAKING 1
#include "tiles.h"

/* log(u) for u in [1, 2] (Cephes' logf: the mantissa in [sqrt(1/2), sqrt(2)), a
   degree-9 polynomial, within 1 ulp). */
AVX512 static inline __m512 log12(__m512 u) {
    __m512 one = _mm512_set1_ps(1.0f);
    __m512 m = _mm512_getmant_ps(u, _MM_MANT_NORM_p5_1, _MM_MANT_SIGN_zero); /* [1/2, 1) */
    __m512 e = _mm512_add_ps(_mm512_getexp_ps(u), one);
    __mmask16 low = _mm512_cmp_ps_mask(m, _mm512_set1_ps(0.707106781186547524f), _CMP_LT_OQ);
    e = _mm512_mask_sub_ps(e, low, e, one);
    __m512 x = _mm512_sub_ps(_mm512_mask_add_ps(m, low, m, m), one);
    __m512 z = _mm512_mul_ps(x, x);
    __m512 y = _mm512_set1_ps(7.0376836292e-2f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(-1.1514610310e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.1676998740e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(-1.2420140846e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.4249322787e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(-1.6668057665e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(2.0000714765e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(-2.4999993993e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(3.3333331174e-1f));
    y = _mm512_mul_ps(_mm512_mul_ps(y, x), z);
    y = _mm512_fmadd_ps(e, _mm512_set1_ps(-2.12194440e-4f), y);
    y = _mm512_fnmadd_ps(_mm512_set1_ps(0.5f), z, y);
    return _mm512_fmadd_ps(e, _mm512_set1_ps(0.693359375f), _mm512_add_ps(x, y));
}

/* Which of the 16 queries i0 + 16 c .. of a block see key j: t = j - i0 - off (the
   queries ii > t see it, ii >= t with attend_current), none past the nq queries,
   and with documents (qd the batch's query documents, kd key j's) those of its
   document. */
AVX512 static inline __mmask16 seen16(const brk_t *a, const int32_t *qd, int32_t kd,
                                      Py_ssize_t i0, Py_ssize_t nq, Py_ssize_t c, Py_ssize_t t) {
    __mmask16 keep = (__mmask16)(nq - 16 * c >= 16 ? 0xffff : (1u << (nq - 16 * c)) - 1);
    Py_ssize_t from = t + 1 - a->current - 16 * c; /* the first lane that sees key j */
    if (from >= 16) return 0;
    if (from > 0) keep &= (__mmask16)(0xffffu << from);
    if (qd)
        keep = _mm512_mask_cmpeq_epi32_mask(keep, _mm512_maskz_loadu_epi32(keep, qd + i0 + 16 * c),
                                            _mm512_set1_epi32(kd));
    return keep;
}

/* Key j breaks the stick of 16 queries (scores z, those in keep): returns their
   weights A = exp(log sigmoid(z) + surv), 0 where not kept, takes softplus(z) off
   *surv where kept, and with beta gives sigmoid(z) there (0 elsewhere). Forward and
   backward both break through here, so the backward's weights are the forward's
   bit for bit. */
AVX512 static inline __m512 break16(__m512 z, __mmask16 keep, __m512 *surv, __m512 *beta) {
    __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
    __m512 x = exp512(_mm512_sub_ps(zero, _mm512_abs_ps(z))); /* exp(-|z|) in (0, 1] */
    __m512 u = _mm512_add_ps(one, x), du = _mm512_sub_ps(u, one);
    /* log1p(x) = log(u) x / (u - 1): u - 1 is exact, and the ratio takes the
       rounding of 1 + x back out; x itself where 1 + x rounds to 1 */
    __mmask16 tiny = _mm512_cmp_ps_mask(du, zero, _CMP_EQ_OQ);
    __m512 t = _mm512_mul_ps(log12(u), _mm512_div_ps(x, _mm512_mask_mov_ps(du, tiny, one)));
    t = _mm512_mask_mov_ps(t, tiny, x);
    __m512 logsig = _mm512_sub_ps(_mm512_min_ps(z, zero), t);
    __m512 sp = _mm512_add_ps(_mm512_max_ps(z, zero), t);
    __m512 la = _mm512_mask_add_ps(_mm512_set1_ps(-INFINITY), keep, logsig, *surv);
    *surv = _mm512_mask_sub_ps(*surv, keep, *surv, sp);
    if (beta) { /* 1 / (1 + exp(-z)) for z >= 0, exp(z) / (1 + exp(z)) below */
        __mmask16 neg = _mm512_cmp_ps_mask(z, zero, _CMP_LT_OQ);
        *beta = _mm512_maskz_div_ps(keep, _mm512_mask_mov_ps(one, neg, x), u);
    }
    return exp512(la);
}

/* The keys kbeg .. kend - 1 that some query of the block i0 .. i0 + nq - 1 of batch b
   may see: before the last query's key position (and it with attend_current), and
   with documents those of the block's documents. */
static void key_range(const brk_t *a, Py_ssize_t b, Py_ssize_t i0, Py_ssize_t nq,
                      Py_ssize_t *kbeg, Py_ssize_t *kend) {
    *kbeg = 0;
    *kend = i0 + nq - 1 + a->off + a->current;
    if (*kend > a->LK) *kend = a->LK;
    if (a->qdoc) {
        const int32_t *qd = a->qdoc + b * a->LQ, *kd = a->kdoc + b * a->LK;
        Py_ssize_t lo = first_at_least(kd, a->LK, qd[i0]);
        Py_ssize_t hi = first_at_least(kd, a->LK, (int64_t)qd[i0 + nq - 1] + 1);
        *kbeg = lo;
        if (hi < *kend) *kend = hi;
    }
}

/* One forward unit: queries i0 .. i0 + nq - 1 of head h of batch b. */
AVX512 static void forward_unit(const brk_t *a, Py_ssize_t b, Py_ssize_t h, Py_ssize_t i0,
                                float *Qt, float *St, float *O, const float **rows) {
    Py_ssize_t D = a->D, DV = a->DV, LQ = a->LQ, LK = a->LK, off = a->off;
    Py_ssize_t nq = LQ - i0 < ABQ ? LQ - i0 : ABQ, nv = (nq + 15) / 16;
    Py_ssize_t hk = h / (a->H / a->HK), kbeg, kend;
    const float *qb = a->q + b * a->qs[0] + h * a->qs[1] + i0 * a->qs[2];
    const float *kb = a->k + b * a->ks[0] + hk * a->ks[1];
    const float *vb = a->v + b * a->vs[0] + hk * a->vs[1];
    const int32_t *qd = a->qdoc ? a->qdoc + b * LQ : NULL, *kd = a->kdoc ? a->kdoc + b * LK : NULL;
    __m512 scale = _mm512_set1_ps(a->scale), surv[4];
    for (int c = 0; c < 4; ++c) surv[c] = _mm512_setzero_ps();
    transpose_block(qb, a->qs[2], nq, D, Qt);
    memset(O, 0, sizeof(float) * (size_t)(ABQ * DV));
    key_range(a, b, i0, nq, &kbeg, &kend);
    for (Py_ssize_t j1 = kend; j1 > kbeg; j1 -= BRK) {
        Py_ssize_t j0 = j1 - BRK > kbeg ? j1 - BRK : kbeg, nk = j1 - j0;
        scores_block(kb + j0 * a->ks[2], a->ks[2], nk, Qt, D, nv, St);
        for (Py_ssize_t jj = nk - 1; jj >= 0; --jj) {
            Py_ssize_t j = j0 + jj;
            for (Py_ssize_t c = 0; c < nv; ++c) {
                float *sp = St + jj * ABQ + 16 * c;
                __mmask16 keep = seen16(a, qd, kd ? kd[j] : 0, i0, nq, c, j - i0 - off);
                __m512 z = _mm512_mul_ps(_mm512_load_ps(sp), scale);
                _mm512_store_ps(sp, break16(z, keep, &surv[c], NULL));
            }
        }
        /* O += A V */
        for (Py_ssize_t jj = 0; jj < nk; ++jj) rows[jj] = vb + (j0 + jj) * a->vs[2];
        acc_block(St, 0, nk, rows, nq, O, DV, DV);
    }
    float *ob = a->out + ((b * a->H + h) * LQ + i0) * DV;
    memcpy(ob, O, sizeof(float) * (size_t)(nq * DV));
    float *lb = a->lrem + (b * a->H + h) * LQ + i0;
    for (Py_ssize_t c = 0; c < nv; ++c) {
        __mmask16 cols = (__mmask16)(nq - 16 * c >= 16 ? 0xffff : (1u << (nq - 16 * c)) - 1);
        _mm512_mask_storeu_ps(lb + 16 * c, cols, surv[c]);
    }
}

/* The unit's (b, h, first query) of unit u, the last blocks of queries (the most
   keys) first. */
static void unit_place(const brk_t *a, Py_ssize_t u, Py_ssize_t *b, Py_ssize_t *h,
                       Py_ssize_t *i0) {
    Py_ssize_t pairs = a->B * a->H, blocks = (a->LQ + ABQ - 1) / ABQ;
    Py_ssize_t bh = u % pairs;
    *b = bh / a->H;
    *h = bh % a->H;
    *i0 = (blocks - 1 - u / pairs) * ABQ;
}

static void *forward_run(void *arg) {
    brk_t *a = (brk_t *)arg;
    size_t qt = sizeof(float) * (size_t)(a->D * ABQ), st = sizeof(float) * BRK * ABQ;
    size_t o = sizeof(float) * (size_t)(ABQ * a->DV);
    char *buf = NULL;
    if (posix_memalign((void **)&buf, 64, qt + st + o + sizeof(float *) * BRK)) {
        a->job.failed = 1;
        return NULL;
    }
    float *Qt = (float *)buf, *St = (float *)(buf + qt), *O = (float *)(buf + qt + st);
    const float **rows = (const float **)(buf + qt + st + o);
    unsigned int csr = flush_to_zero();
    for (;;) {
        Py_ssize_t u = __atomic_fetch_add(a->next, 1, __ATOMIC_RELAXED), b, h, i0;
        if (u >= a->units) break;
        unit_place(a, u, &b, &h, &i0);
        forward_unit(a, b, h, i0, Qt, St, O, rows);
    }
    _mm_setcsr(csr);
    free(buf);
    return NULL;
}

typedef struct {
    float *Qt, *dOt, *St, *dSt, *total;
    const float **krows, **qrows, **orows;
} brk_buf_t;

/* One backward unit: queries i0 .. i0 + nq - 1 of head h of batch b, its keys in the
   forward's order. St holds the weights A (for dv), dSt first dout . v, then the
   scaled score gradients scale dz (for dq and dk). */
AVX512 static void backward_unit(const brk_t *a, Py_ssize_t b, Py_ssize_t h, Py_ssize_t i0,
                                 const brk_buf_t *t) {
    Py_ssize_t D = a->D, DV = a->DV, LQ = a->LQ, LK = a->LK, off = a->off;
    Py_ssize_t nq = LQ - i0 < ABQ ? LQ - i0 : ABQ, nv = (nq + 15) / 16;
    Py_ssize_t hk = h / (a->H / a->HK), kbeg, kend;
    const float *qb = a->q + b * a->qs[0] + h * a->qs[1] + i0 * a->qs[2];
    const float *kb = a->k + b * a->ks[0] + hk * a->ks[1];
    const float *vb = a->v + b * a->vs[0] + hk * a->vs[1];
    const float *ob = a->dout + ((b * a->H + h) * LQ + i0) * DV;
    const int32_t *qd = a->qdoc ? a->qdoc + b * LQ : NULL, *kd = a->kdoc ? a->kdoc + b * LK : NULL;
    float *dkb = a->dk + (b * a->HK + hk) * LK * D, *dvb = a->dv + (b * a->HK + hk) * LK * DV;
    __m512 scale = _mm512_set1_ps(a->scale), surv[4], nearer[4], total[4];
    transpose_block(qb, a->qs[2], nq, D, t->Qt);
    transpose_block(ob, DV, nq, DV, t->dOt);
    for (Py_ssize_t ii = 0; ii < ABQ; ++ii)
        t->total[ii] = ii < nq ? a->total[(b * a->H + h) * LQ + i0 + ii] : 0.0f;
    for (int c = 0; c < 4; ++c) {
        surv[c] = nearer[c] = _mm512_setzero_ps();
        total[c] = _mm512_load_ps(t->total + 16 * c);
    }
    for (Py_ssize_t ii = 0; ii < nq; ++ii) {
        t->qrows[ii] = qb + ii * a->qs[2];
        t->orows[ii] = ob + ii * DV;
    }
    key_range(a, b, i0, nq, &kbeg, &kend);
    for (Py_ssize_t j1 = kend; j1 > kbeg; j1 -= BRK) {
        Py_ssize_t j0 = j1 - BRK > kbeg ? j1 - BRK : kbeg, nk = j1 - j0;
        scores_block(kb + j0 * a->ks[2], a->ks[2], nk, t->Qt, D, nv, t->St);
        scores_block(vb + j0 * a->vs[2], a->vs[2], nk, t->dOt, DV, nv, t->dSt);
        for (Py_ssize_t jj = nk - 1; jj >= 0; --jj) {
            Py_ssize_t j = j0 + jj;
            for (Py_ssize_t c = 0; c < nv; ++c) {
                float *sp = t->St + jj * ABQ + 16 * c, *dp = t->dSt + jj * ABQ + 16 * c;
                __mmask16 keep = seen16(a, qd, kd ? kd[j] : 0, i0, nq, c, j - i0 - off);
                __m512 z = _mm512_mul_ps(_mm512_load_ps(sp), scale), beta;
                __m512 w = break16(z, keep, &surv[c], &beta);
                __m512 g = _mm512_maskz_mul_ps(keep, w, _mm512_load_ps(dp));
                /* sum_{m <= j} g_im + rem_i drem_i: the total less the nearer keys' */
                __m512 far = _mm512_sub_ps(total[c], nearer[c]);
                __m512 dz = _mm512_maskz_sub_ps(keep, g, _mm512_mul_ps(beta, far));
                nearer[c] = _mm512_add_ps(nearer[c], g);
                _mm512_store_ps(sp, w);
                _mm512_store_ps(dp, _mm512_mul_ps(dz, scale));
            }
        }
        for (Py_ssize_t jj = 0; jj < nk; ++jj) t->krows[jj] = kb + (j0 + jj) * a->ks[2];
        acc_block(t->dSt, 0, nk, t->krows, nq, a->dq + ((b * a->H + h) * LQ + i0) * D, D, D);
        acc_block(t->dSt, 1, nq, t->qrows, nk, dkb + j0 * D, D, D);
        acc_block(t->St, 1, nq, t->orows, nk, dvb + j0 * DV, DV, DV);
    }
}

static void *backward_run(void *arg) {
    brk_t *a = (brk_t *)arg;
    a->dk = a->dks[a->job.tid], a->dv = a->dvs[a->job.tid];
    size_t f = sizeof(float), D = (size_t)a->D, DV = (size_t)a->DV;
    size_t floats = D * ABQ + DV * ABQ + 2 * BRK * ABQ + ABQ;
    char *buf = NULL;
    if (posix_memalign((void **)&buf, 64, f * floats + sizeof(float *) * (BRK + 2 * ABQ))) {
        a->job.failed = 1;
        return NULL;
    }
    brk_buf_t t;
    t.Qt = (float *)buf;
    t.dOt = t.Qt + D * ABQ;
    t.St = t.dOt + DV * ABQ;
    t.dSt = t.St + BRK * ABQ;
    t.total = t.dSt + BRK * ABQ;
    t.krows = (const float **)(t.total + ABQ);
    t.qrows = t.krows + BRK;
    t.orows = t.qrows + ABQ;
    unsigned int csr = flush_to_zero();
    for (;;) {
        Py_ssize_t u = __atomic_fetch_add(a->next, 1, __ATOMIC_RELAXED), b, h, i0;
        if (u >= a->units) break;
        unit_place(a, u, &b, &h, &i0);
        backward_unit(a, b, h, i0, &t);
    }
    _mm_setcsr(csr);
    free(buf);
    return NULL;
}

/* dk[e] and dv[e] (thread 0's, the outputs) += the other threads', for this thread's
   share of the elements. */
AVX512 static void *backward_sum(void *arg) {
    brk_t *a = (brk_t *)arg;
    sum_partials(a->dks, a->B * a->HK * a->LK * a->D, 1.0f, &a->job);
    sum_partials(a->dvs, a->B * a->HK * a->LK * a->DV, 1.0f, &a->job);
    return NULL;
}
#endif

/* Reads the sizes, strides, query offset and documents (None or (qdoc, kdoc)
   addresses) both functions take into a. */
static int read_args(brk_t *a, PyObject *sizes, PyObject *qstr, PyObject *kstr, PyObject *vstr,
                     int threads, Py_ssize_t off, PyObject *docs) {
    memset(a, 0, sizeof *a);
    Py_ssize_t sz[7];
    if (posenc_read_layout(sizes, 7, qstr, kstr, vstr, threads, sz, a->qs, a->ks, a->vs,
                           "breaking"))
        return -1;
    a->B = sz[0], a->H = sz[1], a->HK = sz[2], a->LQ = sz[3], a->LK = sz[4];
    a->D = sz[5], a->DV = sz[6], a->off = off;
    if (off < 0 || a->LQ + off > a->LK) {
        PyErr_SetString(PyExc_ValueError, "breaking: the offset must be in 0 .. LK - LQ");
        return -1;
    }
    return posenc_read_docs(docs, &a->qdoc, &a->kdoc);
}

PyObject *posenc_breaking(PyObject *self, PyObject *args) {
    unsigned long long qp, kp, vp, op, lp;
    PyObject *sizes, *qstr, *kstr, *vstr, *docs;
    int current, threads;
    double scale;
    Py_ssize_t off;
    if (!PyArg_ParseTuple(args, "KKKKKOOOOpdinO", &qp, &kp, &vp, &op, &lp, &sizes, &qstr, &kstr,
                          &vstr, &current, &scale, &threads, &off, &docs))
        return NULL;
    brk_t base;
    if (read_args(&base, sizes, qstr, kstr, vstr, threads, off, docs)) return NULL;
#ifdef HAVE_AVX512_BREAKING
    if (!__builtin_cpu_supports("avx512f") || base.DV % 16) Py_RETURN_FALSE;
    base.q = (const float *)(uintptr_t)qp;
    base.k = (const float *)(uintptr_t)kp;
    base.v = (const float *)(uintptr_t)vp;
    base.out = (float *)(uintptr_t)op;
    base.lrem = (float *)(uintptr_t)lp;
    base.current = current;
    base.scale = (float)scale;
    base.units = base.B * base.H * ((base.LQ + ABQ - 1) / ABQ);
    if (threads > base.units) threads = (int)base.units;
    Py_ssize_t next = 0;
    base.next = &next;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = posenc_launch(forward_run, &base, sizeof base, threads);
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    Py_RETURN_TRUE;
#else
    (void)qp, (void)kp, (void)vp, (void)op, (void)lp, (void)current, (void)scale;
    Py_RETURN_FALSE;
#endif
}

PyObject *posenc_breaking_backward(PyObject *self, PyObject *args) {
    unsigned long long qp, kp, vp, gp, tp, dqp, dkp, dvp;
    PyObject *sizes, *qstr, *kstr, *vstr, *docs;
    int current, threads;
    double scale;
    Py_ssize_t off;
    if (!PyArg_ParseTuple(args, "KKKKKKKKOOOOpdinO", &qp, &kp, &vp, &gp, &tp, &dqp, &dkp, &dvp,
                          &sizes, &qstr, &kstr, &vstr, &current, &scale, &threads, &off, &docs))
        return NULL;
    brk_t base;
    if (read_args(&base, sizes, qstr, kstr, vstr, threads, off, docs)) return NULL;
#ifdef HAVE_AVX512_BREAKING
    if (!__builtin_cpu_supports("avx512f") || base.DV % 16 || base.D % 16) Py_RETURN_FALSE;
    base.q = (const float *)(uintptr_t)qp;
    base.k = (const float *)(uintptr_t)kp;
    base.v = (const float *)(uintptr_t)vp;
    base.dout = (const float *)(uintptr_t)gp;
    base.total = (const float *)(uintptr_t)tp;
    base.dq = (float *)(uintptr_t)dqp;
    base.current = current;
    base.scale = (float)scale;
    base.units = base.B * base.H * ((base.LQ + ABQ - 1) / ABQ);
    if (threads > base.units) threads = (int)base.units;
    Py_ssize_t next = 0;
    base.next = &next;
    /* dk and dv (zeroed by the caller) take thread 0's sums; the others get zeroed
       buffers of their own */
    size_t nk = (size_t)(base.B * base.HK * base.LK * base.D);
    size_t nv = (size_t)(base.B * base.HK * base.LK * base.DV);
    base.dks = posenc_partials((float *)(uintptr_t)dkp, nk, threads);
    base.dvs = posenc_partials((float *)(uintptr_t)dvp, nv, threads);
    int failed = !base.dks || !base.dvs;
    if (!failed) {
        Py_BEGIN_ALLOW_THREADS
        failed = posenc_launch(backward_run, &base, sizeof base, threads) ||
                 (threads > 1 && posenc_launch(backward_sum, &base, sizeof base, threads));
        Py_END_ALLOW_THREADS
    }
    posenc_partials_free(base.dks, threads);
    posenc_partials_free(base.dvs, threads);
    if (failed) return PyErr_NoMemory();
    Py_RETURN_TRUE;
#else
    (void)qp, (void)kp, (void)vp, (void)gp, (void)tp, (void)dqp, (void)dkp, (void)dvp,
        (void)current, (void)scale;
    Py_RETURN_FALSE;
#endif
}
