/* attend_mixed(q, k, v, out, lse, table, mask, mlp, sizes, q_strides, k_strides,
                v_strides, causal, scale, slope, threads, off, docs) -> bool

   Softmax attention whose scores are refined by an MLP that mixes the heads: DAPE
   (Zheng et al. 2024), posenc.DAPE. Per (query i, key j) pair, over the H heads of
   q at once,

       A_h = S_h + (B_h + mlp([S ; B])_h),
       mlp(x) = w2 leaky(w1 x + b1) + b2,  leaky(z) = z > 0 ? z : slope z,

   S_h = (q_i . k_j) * scale the scaled score before any mask and B_h the base bias,
   bias = table[h * (LQ + LK - 1) + LK - 1 - j + i], the (H, LQ + LK - 1) table over
   key - query reversed as attend (attend.c) reads it. mlp = (w1, b1, w2, b2), the
   addresses of w1 (W, 2H) (inputs S_0 .. S_{H-1}, B_0 .. B_{H-1}), b1 (W), w2 (H, W)
   and b2 (H), C-contiguous float32. Addresses as ints; sizes = [B, H, HK, LQ, LK, D,
   DV, W]; q, k, v, out, lse, mask, off, docs, causal and scale as attend reads
   them (head h reads kv head h / (H / HK); query i at key position i + off).

   The reference (and the blockwise form of posenc.DAPE) zeroes B above the diagonal
   when causal; those pairs are masked, and a pair's MLP reaches only that pair's
   scores, so the loop reads B there as it is and nothing it outputs changes.

   A unit is a block of ABQ queries of one batch over all H heads (the MLP mixes
   them): per block of MBK keys, the H score tiles, then per key and 16 queries
   (along the lanes) the MLP with broadcast weights, then each head's online
   softmax and O_h += P_h V. A vector of 16 pairs all masked skips the MLP.

   Returns False (doing nothing) without AVX-512, D or DV not a multiple of 16, H
   above MIX_HEADS or W above MIX_WIDTH. exp, masking, a query that sees no key
   (out 0, lse -inf) and NaN as attend.

   attend_mixed_backward(q, k, v, lse, dout, delta, table, mask, mlp, dq, dk, dv,
                         grads, sizes, q_strides, k_strides, v_strides, causal, scale,
                         slope, threads, off, docs) -> bool

   Its gradients from attend_mixed's lse and delta = rowsum(dout * out) (B, H, LQ),
   recomputing the scores: dA_h = P_h (dO_h . v_j - delta_h); through the MLP, dhid =
   leaky'(w1 x + b1) * (w2^T dA), dx = w1^T dhid, so that dS_h = dA_h + dx_h (the
   identity path and the MLP's) reaches q and k times the scale and dB_h = dA_h +
   dx_{H+h} the table, summed along each diagonal; dw1 += dhid x^T, db1 += dhid,
   dw2 += dA leaky(..)^T, db2 += dA. dout (B, H, LQ, DV) C-contiguous; dq (B, H, LQ,
   D), dk (B, HK, LK, D), dv (B, HK, LK, DV) C-contiguous and zeroed; grads = (dtable,
   dw1, db1, dw2, db2), addresses of zeroed buffers shaped as table, w1, b1, w2, b2.

   Units are the forward's (each owns its queries' rows of dq). dk, dv and the
   table's gradient gather from every unit, so each thread adds them into its own
   buffer (thread 0 into the outputs), summed after; the MLP's gradients are summed
   per thread and lane ((2H + 1 + H) W + H vectors of 16) and reduced after. Memory
   beyond the outputs: a dk, dv and dtable per thread but the first. The sums are
   taken in the order the threads take the units: equal to float32 rounding from
   run to run, not bit for bit. */

#include "common.h"

#define MIX_HEADS 16 /* the most heads: the MLP's inputs and outputs stay in registers */
#define MIX_WIDTH 64 /* the most hidden units */
#define MBK 64       /* keys per block: H score tiles of MBK x ABQ stay in L2 */

typedef struct {
    team_job_t job; /* first: posenc_launch numbers the copies */
    const float *q, *k, *v, *table, *w1, *b1, *w2, *b2;
    const uint8_t *mask;
    const int32_t *qdoc, *kdoc; /* documents (B, LQ) and (B, LK), or 0 */
    float *out, *lse;           /* the forward's outputs; lse the backward's input */
    const float *dout, *delta;  /* the backward's inputs (0 in the forward) */
    float *dq;                  /* the output: each unit writes its own queries' rows */
    float *dk, *dv, *dtab;      /* this thread's sums */
    float *lanes;               /* this thread's per-lane sums of dw1, db1, dw2, db2 */
    float **dks, **dvs, **dtabs, **laness; /* every thread's, for the sum */
    Py_ssize_t off, B, H, HK, LQ, LK, D, DV, W;
    Py_ssize_t qs[3], ks[3], vs[3];
    int causal;
    float scale, slope;
    Py_ssize_t units, *next;
} mix_t;

#if defined(__GNUC__) && defined(__x86_64__)
#define HAVE_AVX512_MIXED 1
#include "tiles.h"

/* inlined into each specialisation below, so that H and W are constants there and
   the MLP's vectors stay in registers */
#define MIX_INLINE __attribute__((target("avx512f"), always_inline, unused)) static inline

/* Which of the 16 pairs (key j, queries i0 + 16 c ..) softmax sees: lanes before nq,
   key j not padding, the same document, and (causal) t = j - i0 - off <= the query. */
MIX_INLINE __mmask16 seen16(const mix_t *a, const int32_t *qd, int32_t kd, int dead,
                            Py_ssize_t i0, Py_ssize_t nq, Py_ssize_t c, Py_ssize_t t) {
    __mmask16 cols = (__mmask16)(nq - 16 * c >= 16 ? 0xffff : (1u << (nq - 16 * c)) - 1);
    __mmask16 keep = dead ? 0 : cols;
    if (qd)
        keep = _mm512_mask_cmpeq_epi32_mask(keep, _mm512_maskz_loadu_epi32(cols, qd + i0 + 16 * c),
                                            _mm512_set1_epi32(kd));
    if (a->causal && t > 16 * c) {
        __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        keep &= _mm512_cmp_epi32_mask(_mm512_add_epi32(lane, _mm512_set1_epi32((int)(16 * c))),
                                      _mm512_set1_epi32((int)t), _MM_CMPINT_NLT);
    }
    return keep;
}

/* The refined scores a[h] of 16 pairs from x = [S ; B] (2H vectors): the MLP, one
   hidden unit at a time (its 2H weights broadcast against x, then its H weights
   against its activation); each unit's pre-activation to pre (W vectors) for the
   backward when pre is not 0. Forward and backward both refine through here, so the
   backward recomputes the forward's scores bit for bit. */
MIX_INLINE void refine16(const mix_t *a, int H, int W, const __m512 *x, __m512 *out,
                         __m512 *pre) {
    /* zeroed: gcc cannot see that the loops of the generic specialisation (H not a
       constant) write what they read; a constant H drops the stores */
    __m512 o[MIX_HEADS] = {0}, slope = _mm512_set1_ps(a->slope), zero = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int h = 0; h < H; ++h) o[h] = _mm512_set1_ps(a->b2[h]);
    for (int u = 0; u < W; ++u) {
        const float *w1 = a->w1 + u * 2 * H;
        __m512 z = _mm512_set1_ps(a->b1[u]);
#pragma GCC unroll 32
        for (int c = 0; c < 2 * H; ++c) z = _mm512_fmadd_ps(_mm512_set1_ps(w1[c]), x[c], z);
        if (pre) pre[u] = z;
        __m512 y = _mm512_mask_mul_ps(z, _mm512_cmp_ps_mask(z, zero, _CMP_LE_OQ), z, slope);
#pragma GCC unroll 16
        for (int h = 0; h < H; ++h) o[h] = _mm512_fmadd_ps(_mm512_set1_ps(a->w2[h * W + u]), y, o[h]);
    }
#pragma GCC unroll 16
    for (int h = 0; h < H; ++h) out[h] = _mm512_add_ps(x[h], _mm512_add_ps(x[H + h], o[h]));
}

/* The per-thread buffers of a unit (see mix_run) */
typedef struct {
    float *Qt, *dOt, *St, *dSt, *O, *m, *l, *alpha, *lse, *delta;
    const float **rows, **qrows, **orows;
} mix_buf_t;

/* x = [S ; B] of the 16 pairs (key jj of the block, queries i0 + 16 c ..): each head's
   raw score tile times the scale, and its table read reversed (0 past nq). */
MIX_INLINE void inputs16(const mix_t *a, int H, const float *St, Py_ssize_t jj, Py_ssize_t c,
                         Py_ssize_t j, Py_ssize_t i0, Py_ssize_t nq, __m512 *x) {
    __mmask16 cols = (__mmask16)(nq - 16 * c >= 16 ? 0xffff : (1u << (nq - 16 * c)) - 1);
    Py_ssize_t n = a->LQ + a->LK - 1;
    const float *tb = a->table + a->LK - 1 - j + i0 + 16 * c;
    __m512 scale = _mm512_set1_ps(a->scale);
#pragma GCC unroll 16
    for (int h = 0; h < H; ++h) {
        x[h] = _mm512_mul_ps(_mm512_load_ps(St + (h * MBK + jj) * ABQ + 16 * c), scale);
        x[H + h] = _mm512_maskz_loadu_ps(cols, tb + h * n);
    }
}

/* The keys a block of queries may see: [*kbeg, *kend) */
static void key_range(const mix_t *a, Py_ssize_t b, Py_ssize_t i0, Py_ssize_t nq, Py_ssize_t *kbeg,
                      Py_ssize_t *kend) {
    *kbeg = 0, *kend = a->LK;
    if (a->causal && i0 + nq + a->off < *kend) *kend = i0 + nq + a->off;
    if (*kend < 0) *kend = 0;
    if (a->qdoc) {
        const int32_t *qd = a->qdoc + b * a->LQ, *kd = a->kdoc + b * a->LK;
        Py_ssize_t lo = first_at_least(kd, a->LK, qd[i0]);
        Py_ssize_t hi = first_at_least(kd, a->LK, (int64_t)qd[i0 + nq - 1] + 1);
        *kbeg = lo > *kbeg ? lo : *kbeg;
        *kend = hi < *kend ? hi : *kend;
    }
}

/* H score tiles (raw q . k) of keys j0 .. j0 + nk - 1 against the transposed queries
   Xt (a head's dim x ABQ apart) into St (a head's MBK x ABQ apart); from v and the
   transposed dO when values is set. */
MIX_INLINE void tiles(const mix_t *a, int H, Py_ssize_t b, Py_ssize_t j0, Py_ssize_t nk,
                      Py_ssize_t nv, int values, const float *Xt, float *St) {
    Py_ssize_t group = H / a->HK, dim = values ? a->DV : a->D;
    const Py_ssize_t *s = values ? a->vs : a->ks;
    const float *base = values ? a->v : a->k;
    for (int h = 0; h < H; ++h)
        scores_block(base + b * s[0] + (h / group) * s[1] + j0 * s[2], s[2], nk, Xt + h * dim * ABQ,
                     dim, nv, St + h * MBK * ABQ);
}

/* One forward unit: queries i0 .. i0 + nq - 1 of batch b, all heads. */
MIX_INLINE void forward_unit(const mix_t *a, int H, int W, Py_ssize_t b, Py_ssize_t i0,
                             const mix_buf_t *t) {
    Py_ssize_t D = a->D, DV = a->DV, LK = a->LK, LQ = a->LQ, off = a->off;
    Py_ssize_t nq = LQ - i0 < ABQ ? LQ - i0 : ABQ, nv = (nq + 15) / 16, group = H / a->HK;
    for (int h = 0; h < H; ++h)
        transpose_block(a->q + b * a->qs[0] + h * a->qs[1] + i0 * a->qs[2], a->qs[2], nq, D,
                        t->Qt + h * D * ABQ);
    for (Py_ssize_t e = 0; e < H * ABQ; ++e) t->m[e] = -INFINITY, t->l[e] = 0.0f;
    memset(t->O, 0, sizeof(float) * (size_t)(H * ABQ * DV));
    const uint8_t *mb = a->mask ? a->mask + b * LK : NULL;
    const int32_t *qd = a->qdoc ? a->qdoc + b * LQ : NULL, *kd = a->kdoc ? a->kdoc + b * LK : NULL;
    Py_ssize_t kbeg, kend;
    key_range(a, b, i0, nq, &kbeg, &kend);
    __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (Py_ssize_t j0 = kbeg; j0 < kend; j0 += MBK) {
        Py_ssize_t nk = kend - j0 < MBK ? kend - j0 : MBK;
        tiles(a, H, b, j0, nk, nv, 0, t->Qt, t->St);
        /* refine and mask; each head's maximum of each query over this block */
        __m512 cmax[MIX_HEADS][4];
        for (int h = 0; h < H; ++h)
            for (int c = 0; c < 4; ++c) cmax[h][c] = ninf;
        for (Py_ssize_t jj = 0; jj < nk; ++jj) {
            Py_ssize_t j = j0 + jj;
            int dead = mb != NULL && mb[j] == 0;
            for (Py_ssize_t c = 0; c < nv; ++c) {
                __mmask16 keep = seen16(a, qd, kd ? kd[j] : 0, dead, i0, nq, c, j - i0 - off);
                if (!keep) {
                    for (int h = 0; h < H; ++h) _mm512_store_ps(t->St + (h * MBK + jj) * ABQ + 16 * c, ninf);
                    continue;
                }
                __m512 x[2 * MIX_HEADS], s[MIX_HEADS] = {0}; /* zeroed: see refine16 */
                inputs16(a, H, t->St, jj, c, j, i0, nq, x);
                refine16(a, H, W, x, s, NULL);
#pragma GCC unroll 16
                for (int h = 0; h < H; ++h) {
                    __m512 v = _mm512_mask_mov_ps(ninf, keep, s[h]);
                    _mm512_store_ps(t->St + (h * MBK + jj) * ABQ + 16 * c, v);
                    cmax[h][c] = _mm512_max_ps(cmax[h][c], v);
                }
            }
        }
        /* each head's online softmax step (tiles.h) and O_h += P_h V */
        for (int h = 0; h < H; ++h) {
            float *St = t->St + h * MBK * ABQ, *m = t->m + h * ABQ, *l = t->l + h * ABQ;
            float *O = t->O + h * ABQ * DV;
            softmax_step(St, nk, nq, nv, cmax[h], m, l, t->alpha, O, DV);
            const float *vb = a->v + b * a->vs[0] + (h / group) * a->vs[1];
            for (Py_ssize_t jj = 0; jj < nk; ++jj) t->rows[jj] = vb + (j0 + jj) * a->vs[2];
            acc_block(St, 0, nk, t->rows, nq, O, DV, DV);
        }
    }
    for (int h = 0; h < H; ++h) {
        float *ob = a->out + ((b * H + h) * LQ + i0) * DV, *lb = a->lse + (b * H + h) * LQ + i0;
        const float *m = t->m + h * ABQ, *l = t->l + h * ABQ, *O = t->O + h * ABQ * DV;
        for (Py_ssize_t ii = 0; ii < nq; ++ii) {
            int none = l[ii] == 0.0f; /* sees no key; a NaN l stays NaN */
            __m512 iv = _mm512_set1_ps(none ? 0.0f : 1.0f / l[ii]);
            for (Py_ssize_t e = 0; e < DV; e += 16)
                _mm512_storeu_ps(ob + ii * DV + e, _mm512_mul_ps(_mm512_loadu_ps(O + ii * DV + e), iv));
            lb[ii] = none ? -INFINITY : m[ii] + logf(l[ii]);
        }
    }
}

/* The MLP's backward for 16 pairs: from x = [S ; B], the pre-activations and dA (H
   vectors, the gradient of the refined scores), the input gradient dx (2H vectors)
   and the lane sums of dw1 (W, 2H, 16), db1 (W, 16), dw2 (H, W, 16), db2 (H, 16). */
MIX_INLINE void mlp_back16(const mix_t *a, int H, int W, const __m512 *x, const __m512 *pre,
                           const __m512 *dA, __m512 *dx, float *lanes) {
    float *gw1 = lanes, *gb1 = gw1 + W * 2 * H * 16, *gw2 = gb1 + W * 16, *gb2 = gw2 + H * W * 16;
    __m512 slope = _mm512_set1_ps(a->slope), zero = _mm512_setzero_ps();
#pragma GCC unroll 32
    for (int c = 0; c < 2 * H; ++c) dx[c] = zero;
    for (int u = 0; u < W; ++u) {
        __m512 g = zero;
#pragma GCC unroll 16
        for (int h = 0; h < H; ++h) g = _mm512_fmadd_ps(_mm512_set1_ps(a->w2[h * W + u]), dA[h], g);
        __mmask16 neg = _mm512_cmp_ps_mask(pre[u], zero, _CMP_LE_OQ);
        __m512 dh = _mm512_mask_mul_ps(g, neg, g, slope);
        __m512 y = _mm512_mask_mul_ps(pre[u], neg, pre[u], slope);
#pragma GCC unroll 16
        for (int h = 0; h < H; ++h) {
            float *p = gw2 + (h * W + u) * 16;
            _mm512_store_ps(p, _mm512_fmadd_ps(dA[h], y, _mm512_load_ps(p)));
        }
        _mm512_store_ps(gb1 + u * 16, _mm512_add_ps(_mm512_load_ps(gb1 + u * 16), dh));
        const float *w1 = a->w1 + u * 2 * H;
        float *p1 = gw1 + u * 2 * H * 16;
#pragma GCC unroll 32
        for (int c = 0; c < 2 * H; ++c) {
            _mm512_store_ps(p1 + c * 16, _mm512_fmadd_ps(dh, x[c], _mm512_load_ps(p1 + c * 16)));
            dx[c] = _mm512_fmadd_ps(_mm512_set1_ps(w1[c]), dh, dx[c]);
        }
    }
#pragma GCC unroll 16
    for (int h = 0; h < H; ++h) _mm512_store_ps(gb2 + h * 16, _mm512_add_ps(_mm512_load_ps(gb2 + h * 16), dA[h]));
}

/* One backward unit: queries i0 .. i0 + nq - 1 of batch b, all heads. Per block of
   keys and head: P and dS (times the scale) recomputed into St and dSt, then dQ_h +=
   dS_h K, dK += dS_h^T Q_h and dV += P_h^T dO_h (this thread's dk and dv). */
MIX_INLINE void backward_unit(const mix_t *a, int H, int W, Py_ssize_t b, Py_ssize_t i0,
                              const mix_buf_t *t) {
    Py_ssize_t D = a->D, DV = a->DV, LK = a->LK, LQ = a->LQ, off = a->off, HK = a->HK;
    Py_ssize_t nq = LQ - i0 < ABQ ? LQ - i0 : ABQ, nv = (nq + 15) / 16, group = H / HK;
    Py_ssize_t n = LQ + LK - 1;
    for (int h = 0; h < H; ++h) {
        const float *qb = a->q + b * a->qs[0] + h * a->qs[1] + i0 * a->qs[2];
        const float *ob = a->dout + ((b * H + h) * LQ + i0) * DV;
        const float *lb = a->lse + (b * H + h) * LQ + i0, *db = a->delta + (b * H + h) * LQ + i0;
        transpose_block(qb, a->qs[2], nq, D, t->Qt + h * D * ABQ);
        transpose_block(ob, DV, nq, DV, t->dOt + h * DV * ABQ);
        for (Py_ssize_t ii = 0; ii < ABQ; ++ii) {
            /* a query that sees no key (lse -inf): any finite stand-in weighs its
               masked scores 0 */
            t->lse[h * ABQ + ii] = ii < nq && lb[ii] != -INFINITY ? lb[ii] : 0.0f;
            t->delta[h * ABQ + ii] = ii < nq ? db[ii] : 0.0f;
        }
        for (Py_ssize_t ii = 0; ii < nq; ++ii) {
            t->qrows[h * ABQ + ii] = qb + ii * a->qs[2];
            t->orows[h * ABQ + ii] = ob + ii * DV;
        }
    }
    const uint8_t *mb = a->mask ? a->mask + b * LK : NULL;
    const int32_t *qd = a->qdoc ? a->qdoc + b * LQ : NULL, *kd = a->kdoc ? a->kdoc + b * LK : NULL;
    Py_ssize_t kbeg, kend;
    key_range(a, b, i0, nq, &kbeg, &kend);
    __m512 zero = _mm512_setzero_ps(), scale = _mm512_set1_ps(a->scale);
    for (Py_ssize_t j0 = kbeg; j0 < kend; j0 += MBK) {
        Py_ssize_t nk = kend - j0 < MBK ? kend - j0 : MBK;
        tiles(a, H, b, j0, nk, nv, 0, t->Qt, t->St);
        tiles(a, H, b, j0, nk, nv, 1, t->dOt, t->dSt);
        for (Py_ssize_t jj = 0; jj < nk; ++jj) {
            Py_ssize_t j = j0 + jj;
            int dead = mb != NULL && mb[j] == 0;
            for (Py_ssize_t c = 0; c < nv; ++c) {
                __mmask16 keep = seen16(a, qd, kd ? kd[j] : 0, dead, i0, nq, c, j - i0 - off);
                Py_ssize_t at = jj * ABQ + 16 * c;
                if (!keep) { /* P and dS 0 */
                    for (int h = 0; h < H; ++h) {
                        _mm512_store_ps(t->St + h * MBK * ABQ + at, zero);
                        _mm512_store_ps(t->dSt + h * MBK * ABQ + at, zero);
                    }
                    continue;
                }
                /* s and dA zeroed: see refine16 */
                __m512 x[2 * MIX_HEADS], s[MIX_HEADS] = {0}, pre[MIX_WIDTH], dA[MIX_HEADS] = {0};
                __m512 dx[2 * MIX_HEADS];
                inputs16(a, H, t->St, jj, c, j, i0, nq, x);
                refine16(a, H, W, x, s, pre);
#pragma GCC unroll 16
                for (int h = 0; h < H; ++h) {
                    __m512 z = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), keep, s[h]);
                    __m512 p = exp512(_mm512_sub_ps(z, _mm512_load_ps(t->lse + h * ABQ + 16 * c)));
                    __m512 dp = _mm512_load_ps(t->dSt + h * MBK * ABQ + at);
                    dA[h] = _mm512_mul_ps(p, _mm512_sub_ps(dp, _mm512_load_ps(t->delta + h * ABQ + 16 * c)));
                    _mm512_store_ps(t->St + h * MBK * ABQ + at, p);
                }
                mlp_back16(a, H, W, x, pre, dA, dx, a->lanes);
                __mmask16 cols = (__mmask16)(nq - 16 * c >= 16 ? 0xffff : (1u << (nq - 16 * c)) - 1);
#pragma GCC unroll 16
                for (int h = 0; h < H; ++h) {
                    __m512 ds = _mm512_add_ps(dA[h], dx[h]);
                    _mm512_store_ps(t->dSt + h * MBK * ABQ + at, _mm512_mul_ps(ds, scale));
                    /* the reversed table: queries of key j read it forwards */
                    float *g = a->dtab + h * n + LK - 1 - j + i0 + 16 * c;
                    __m512 gt = _mm512_add_ps(dA[h], dx[H + h]);
                    _mm512_mask_storeu_ps(g, cols, _mm512_add_ps(_mm512_maskz_loadu_ps(cols, g), gt));
                }
            }
        }
        for (int h = 0; h < H; ++h) {
            Py_ssize_t hk = h / group;
            const float *kb = a->k + b * a->ks[0] + hk * a->ks[1];
            const float *St = t->St + h * MBK * ABQ, *dSt = t->dSt + h * MBK * ABQ;
            for (Py_ssize_t jj = 0; jj < nk; ++jj) t->rows[jj] = kb + (j0 + jj) * a->ks[2];
            acc_block(dSt, 0, nk, t->rows, nq, a->dq + ((b * H + h) * LQ + i0) * D, D, D);
            acc_block(dSt, 1, nq, t->qrows + h * ABQ, nk, a->dk + ((b * HK + hk) * LK + j0) * D, D, D);
            acc_block(St, 1, nq, t->orows + h * ABQ, nk, a->dv + ((b * HK + hk) * LK + j0) * DV, DV, DV);
        }
    }
}

/* The loops specialised for the usual head counts at the paper's width (H and W
   constants: the MLP's vectors in registers), and for any other. */
#define MIX_LOOPS(NAME, HH, WW)                                                                 \
    AVX512 static void forward_##NAME(const mix_t *a, Py_ssize_t b, Py_ssize_t i0, const mix_buf_t *t) { \
        forward_unit(a, HH, WW, b, i0, t);                                                      \
    }                                                                                           \
    AVX512 static void backward_##NAME(const mix_t *a, Py_ssize_t b, Py_ssize_t i0, const mix_buf_t *t) { \
        backward_unit(a, HH, WW, b, i0, t);                                                     \
    }
MIX_LOOPS(h4w32, 4, 32)
MIX_LOOPS(h8w32, 8, 32)
MIX_LOOPS(h12w32, 12, 32)
MIX_LOOPS(h16w32, 16, 32)
MIX_LOOPS(any, (int)a->H, (int)a->W)

typedef void (*mix_unit_fn)(const mix_t *, Py_ssize_t, Py_ssize_t, const mix_buf_t *);

static mix_unit_fn pick(const mix_t *a, int backward) {
    static const mix_unit_fn fwd[5] = {forward_h4w32, forward_h8w32, forward_h12w32, forward_h16w32, forward_any};
    static const mix_unit_fn bwd[5] = {backward_h4w32, backward_h8w32, backward_h12w32, backward_h16w32, backward_any};
    int which = a->W != 32 || a->H % 4 ? 4 : (int)(a->H / 4 - 1);
    return backward ? bwd[which] : fwd[which];
}

/* A thread: takes units (b, block of queries) from the shared counter, the last blocks
   first (under a causal mask they see the most keys: longest first balances). */
static void *mix_run(mix_t *a, int backward) {
    if (backward) {
        int i = a->job.tid;
        a->dk = a->dks[i], a->dv = a->dvs[i], a->dtab = a->dtabs[i], a->lanes = a->laness[i];
    }
    size_t f = sizeof(float), H = (size_t)a->H, D = (size_t)a->D, DV = (size_t)a->DV;
    size_t floats = H * (D * ABQ + DV * ABQ + 2 * MBK * ABQ + ABQ * DV + 4 * ABQ) + ABQ;
    char *buf = NULL;
    if (posix_memalign((void **)&buf, 64, f * floats + sizeof(float *) * (MBK + 2 * H * ABQ))) {
        a->job.failed = 1;
        return NULL;
    }
    mix_buf_t t;
    t.Qt = (float *)buf;
    t.dOt = t.Qt + H * D * ABQ;
    t.St = t.dOt + H * DV * ABQ;
    t.dSt = t.St + H * MBK * ABQ;
    t.O = t.dSt + H * MBK * ABQ;
    t.m = t.O + H * ABQ * DV;
    t.l = t.m + H * ABQ;
    t.lse = t.l + H * ABQ;
    t.delta = t.lse + H * ABQ;
    t.alpha = t.delta + H * ABQ;
    t.rows = (const float **)(t.alpha + ABQ);
    t.qrows = t.rows + MBK;
    t.orows = t.qrows + H * ABQ;
    mix_unit_fn unit = pick(a, backward);
    Py_ssize_t blocks = (a->LQ + ABQ - 1) / ABQ;
    unsigned int csr = flush_to_zero();
    for (;;) {
        Py_ssize_t u = __atomic_fetch_add(a->next, 1, __ATOMIC_RELAXED);
        if (u >= a->units) break;
        unit(a, u % a->B, (blocks - 1 - u / a->B) * ABQ, &t);
    }
    _mm_setcsr(csr);
    free(buf);
    return NULL;
}

static void *mix_forward_run(void *arg) { return mix_run((mix_t *)arg, 0); }
static void *mix_backward_run(void *arg) { return mix_run((mix_t *)arg, 1); }

/* The threads' dk, dv and dtable summed into thread 0's (the outputs), each thread a
   share of the elements. */
AVX512 static void *mix_sum(void *arg) {
    mix_t *a = (mix_t *)arg;
    sum_partials(a->dks, a->B * a->HK * a->LK * a->D, 1.0f, &a->job);
    sum_partials(a->dvs, a->B * a->HK * a->LK * a->DV, 1.0f, &a->job);
    sum_partials(a->dtabs, a->H * (a->LQ + a->LK - 1), 1.0f, &a->job);
    return NULL;
}
#endif

/* Reads sizes, strides, the MLP's addresses, the offset and documents into a. */
static int mix_read(mix_t *a, PyObject *sizes, PyObject *qstr, PyObject *kstr, PyObject *vstr,
                    PyObject *mlp, Py_ssize_t off, PyObject *docs, int threads) {
    Py_ssize_t sz[8];
    unsigned long long w1, b1, w2, b2;
    if (posenc_read_layout(sizes, 8, qstr, kstr, vstr, threads, sz, a->qs, a->ks, a->vs,
                           "attend_mixed") ||
        !PyArg_ParseTuple(mlp, "KKKK", &w1, &b1, &w2, &b2) ||
        posenc_read_docs(docs, &a->qdoc, &a->kdoc))
        return -1;
    a->B = sz[0], a->H = sz[1], a->HK = sz[2], a->LQ = sz[3], a->LK = sz[4];
    a->D = sz[5], a->DV = sz[6], a->W = sz[7];
    a->w1 = (const float *)(uintptr_t)w1;
    a->b1 = (const float *)(uintptr_t)b1;
    a->w2 = (const float *)(uintptr_t)w2;
    a->b2 = (const float *)(uintptr_t)b2;
    a->off = off;
    return 0;
}

#ifdef HAVE_AVX512_MIXED
/* Whether the loop runs for these sizes (else the functions return False). */
static int mix_runs(const mix_t *a) {
    return __builtin_cpu_supports("avx512f") && a->D % 16 == 0 && a->DV % 16 == 0 &&
           a->H <= MIX_HEADS && a->W <= MIX_WIDTH;
}
#endif

PyObject *posenc_attend_mixed(PyObject *self, PyObject *args) {
    unsigned long long qp, kp, vp, op, lp, tp, mp;
    PyObject *mlp, *sizes, *qstr, *kstr, *vstr, *docs;
    int causal, threads;
    double scale, slope;
    Py_ssize_t off;
    if (!PyArg_ParseTuple(args, "KKKKKKKOOOOOpddinO", &qp, &kp, &vp, &op, &lp, &tp, &mp, &mlp,
                          &sizes, &qstr, &kstr, &vstr, &causal, &scale, &slope, &threads, &off,
                          &docs))
        return NULL;
    mix_t base;
    memset(&base, 0, sizeof base);
    if (mix_read(&base, sizes, qstr, kstr, vstr, mlp, off, docs, threads)) return NULL;
#ifdef HAVE_AVX512_MIXED
    if (!mix_runs(&base)) Py_RETURN_FALSE;
    base.q = (const float *)(uintptr_t)qp;
    base.k = (const float *)(uintptr_t)kp;
    base.v = (const float *)(uintptr_t)vp;
    base.out = (float *)(uintptr_t)op;
    base.lse = (float *)(uintptr_t)lp;
    base.table = (const float *)(uintptr_t)tp;
    base.mask = (const uint8_t *)(uintptr_t)mp;
    base.causal = causal;
    base.scale = (float)scale;
    base.slope = (float)slope;
    base.units = base.B * ((base.LQ + ABQ - 1) / ABQ);
    if (threads > base.units) threads = (int)base.units;
    Py_ssize_t next = 0;
    base.next = &next;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = posenc_launch(mix_forward_run, &base, sizeof base, threads);
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    Py_RETURN_TRUE;
#else
    (void)qp, (void)kp, (void)vp, (void)op, (void)lp, (void)tp, (void)mp, (void)causal,
        (void)scale, (void)slope;
    Py_RETURN_FALSE;
#endif
}

PyObject *posenc_attend_mixed_backward(PyObject *self, PyObject *args) {
    unsigned long long qp, kp, vp, lp, gp, dp, tp, mp, dqp, dkp, dvp, g[5];
    PyObject *mlp, *grads, *sizes, *qstr, *kstr, *vstr, *docs;
    int causal, threads;
    double scale, slope;
    Py_ssize_t off;
    if (!PyArg_ParseTuple(args, "KKKKKKKKOKKKOOOOOpddinO", &qp, &kp, &vp, &lp, &gp, &dp, &tp, &mp,
                          &mlp, &dqp, &dkp, &dvp, &grads, &sizes, &qstr, &kstr, &vstr, &causal,
                          &scale, &slope, &threads, &off, &docs))
        return NULL;
    mix_t base;
    memset(&base, 0, sizeof base);
    if (mix_read(&base, sizes, qstr, kstr, vstr, mlp, off, docs, threads)) return NULL;
    if (!PyArg_ParseTuple(grads, "KKKKK", &g[0], &g[1], &g[2], &g[3], &g[4])) return NULL;
#ifdef HAVE_AVX512_MIXED
    if (!mix_runs(&base)) Py_RETURN_FALSE;
    base.q = (const float *)(uintptr_t)qp;
    base.k = (const float *)(uintptr_t)kp;
    base.v = (const float *)(uintptr_t)vp;
    base.lse = (float *)(uintptr_t)lp;
    base.dout = (const float *)(uintptr_t)gp;
    base.delta = (const float *)(uintptr_t)dp;
    base.table = (const float *)(uintptr_t)tp;
    base.mask = (const uint8_t *)(uintptr_t)mp;
    base.dq = (float *)(uintptr_t)dqp;
    base.causal = causal;
    base.scale = (float)scale;
    base.slope = (float)slope;
    base.units = base.B * ((base.LQ + ABQ - 1) / ABQ);
    if (threads > base.units) threads = (int)base.units;
    Py_ssize_t next = 0;
    base.next = &next;
    size_t H = (size_t)base.H, W = (size_t)base.W;
    size_t nk = (size_t)(base.B * base.HK * base.LK * base.D);
    size_t nv = (size_t)(base.B * base.HK * base.LK * base.DV);
    size_t nt = H * (size_t)(base.LQ + base.LK - 1), nl = ((2 * H + 1 + H) * W + H) * 16;
    /* thread 0 adds into the outputs (zeroed by the caller), the others into zeroed
       buffers of their own; every thread has its lane sums (64-byte aligned) */
    base.dks = posenc_partials((float *)(uintptr_t)dkp, nk, threads);
    base.dvs = posenc_partials((float *)(uintptr_t)dvp, nv, threads);
    base.dtabs = posenc_partials((float *)(uintptr_t)g[0], nt, threads);
    float **lanes = base.laness = (float **)calloc((size_t)threads, sizeof(float *));
    int failed = !base.dks || !base.dvs || !base.dtabs || !lanes;
    for (int i = 0; i < threads && !failed; ++i) {
        if (!posix_memalign((void **)&lanes[i], 64, sizeof(float) * nl))
            memset(lanes[i], 0, sizeof(float) * nl);
        else
            lanes[i] = NULL;
        failed |= lanes[i] == NULL;
    }
    if (!failed) {
        Py_BEGIN_ALLOW_THREADS
        failed = posenc_launch(mix_backward_run, &base, sizeof base, threads) ||
                 posenc_launch(mix_sum, &base, sizeof base, threads);
        if (!failed) {
            /* the lane sums, in the order dw1 (W, 2H), db1 (W), dw2 (H, W), db2 (H) */
            float *out[4] = {(float *)(uintptr_t)g[1], (float *)(uintptr_t)g[2],
                             (float *)(uintptr_t)g[3], (float *)(uintptr_t)g[4]};
            size_t count[4] = {W * 2 * H, W, H * W, H};
            for (int i = 0; i < threads; ++i) {
                const float *src = lanes[i];
                for (int part = 0; part < 4; ++part)
                    for (size_t e = 0; e < count[part]; ++e, src += 16) {
                        float s = 0.0f;
                        for (int lane = 0; lane < 16; ++lane) s += src[lane];
                        out[part][e] += s;
                    }
            }
        }
        Py_END_ALLOW_THREADS
    }
    for (int i = 0; lanes && i < threads; ++i) free(lanes[i]);
    free(lanes);
    posenc_partials_free(base.dks, threads);
    posenc_partials_free(base.dvs, threads);
    posenc_partials_free(base.dtabs, threads);
    if (failed) return PyErr_NoMemory();
    Py_RETURN_TRUE;
#else
    (void)qp, (void)kp, (void)vp, (void)lp, (void)gp, (void)dp, (void)tp, (void)mp, (void)dqp,
        (void)dkp, (void)dvp, (void)causal, (void)scale, (void)slope, (void)g;
    Py_RETURN_FALSE;
#endif
}
