/* attend_counted(q, k, v, out, lse, emb, mask, sizes, q_strides, k_strides, v_strides,
                  npos, factor, scale, threads, off, docs) -> bool

   CoPE's causal softmax attention (Golovneva et al. 2024; posenc.CoPE) for float32
   CPU tensors, flash-attention style as attend.c's loop: nothing quadratic is held.
   Addresses as ints; sizes = [B, H, HK, LQ, LK, D, DV]; q (B, H, LQ, D), k (B, HK, LK,
   D), v (B, HK, LK, DV) with unit stride along the last dim and element strides
   *_strides over the first three; head h reads kv head h / (H / HK). emb is the
   position embeddings transposed, (npos, D) C-contiguous (row t = e[:, t]). out (B,
   H, LQ, DV) and lse (B, H, LQ) are C-contiguous, lse -inf (and the output row 0)
   for a query that sees no key. Query i sits at key position i + off (LK - LQ for a
   KV cache) and sees keys j <= i + off, not padding (mask[b * LK + j] == 0 when mask
   is not 0) and of its own document (docs = (qdoc, kdoc) as attend reads them).

   Query i scores a key it sees z_ij + factor * ((1 - w) QE[i, floor p_ij] + w QE[i,
   ceil p_ij]), z = q . k * scale, QE = q e (the query against every position),
   p_ij = min(sum_{k = j .. i + off} g_ik, npos - 1), w = p_ij - floor p_ij, the
   gates g_ik = sigmoid(z_ik) on the keys the query sees and 0 on the others (so a
   count restarts with each document). A unit (batch, head, block of ABQ queries,
   the queries along the vector lanes) takes its keys in blocks DESCENDING from the
   diagonal and each block's keys descending too, so that each lane's count is a
   running sum; the online softmax does not care about the order. A count only
   grows, so once every live lane of a vector of 16 queries has reached npos - 1 its
   keys all read QE[npos - 1] and their gates no longer matter: the gates, the
   counts and the gathers stop there (with npos ~ 65 only the keys near the
   diagonal pay for them). QE's rows are made as the counts reach them (a count
   grows by at most one per key).

   Returns False (doing nothing) without AVX-512, or DV not a multiple of 16.

   attend_counted_backward(q, k, v, emb, mask, lse, dout, delta, dq, dk, dv, demb,
                           sizes, q_strides, k_strides, v_strides, npos, factor,
                           scale, threads, off, docs) -> bool

   Its gradients from attend_counted's lse and delta = rowsum(dout * out) (B, H, LQ,
   C-contiguous like dout (B, H, LQ, DV)). Writes dq (B, H, LQ, D) and adds into dk
   (B, HK, LK, D), dv (B, HK, LK, DV) and demb (npos, D, the gradient of emb as
   passed; 0 when not wanted), all C-contiguous and dk, dv, demb zeroed. With dS =
   P (dO . v - delta) the score gradient, the position term reaches QE (dS factor
   (1 - w) at floor p, dS factor w at ceil p: dq += dQE e^T, demb += q^T dQE), and p
   through w: dp_ij = dS_ij factor (QE[ceil] - QE[floor]), 0 where the count is past
   npos - 1. A gate g_ik is in p_ij for every j <= k, so dg_ik = sum_{j <= k} dp_ij,
   a prefix over the keys, against the forward's descending scan: each unit first
   takes the keys descending to its row totals T_i = sum_j dp_ij (stopping where
   the vectors' counts are all clamped: dp is 0 beyond), then again, recomputing the
   forward's scores and counts bit for bit, with dg_ik = T_i - (the dp of keys j > k
   summed so far), dz_ik = dS_ik + dg_ik g_ik (1 - g_ik), dq += dz k scale, dk += dz^T
   q scale, dv += P^T dO. Units are query-major (a unit's counts need all its keys),
   so each thread but the first adds dk, dv and demb into zeroed buffers of its own
   (B, HK, LK, D + DV and npos, D), summed after: equal to float32 rounding from run
   to run, not bit for bit. Returns False (doing nothing) without AVX-512, or D or
   DV not a multiple of 16. */

#include "common.h"

#define CFK 256 /* keys per forward block */
#define CBK 64  /* keys per backward block: its P and dz blocks stay in L1/L2 */

typedef struct {
    team_job_t job; /* first: posenc_launch numbers the copies */
    const float *q, *k, *v, *emb;
    const uint8_t *mask;
    const int32_t *qdoc, *kdoc; /* (B, LQ) and (B, LK) documents, or 0 */
    float *out, *lse;
    Py_ssize_t B, H, HK, LQ, LK, D, DV, npos, off;
    Py_ssize_t qs[3], ks[3], vs[3];
    float scale, factor;
    Py_ssize_t units;
    Py_ssize_t *next; /* the next unit to take, shared */
    /* the backward's */
    const float *dout, *delta;
    float *dq, *dk, *dv, *demb; /* dk, dv and demb: this thread's */
    float **dks, **dvs, **dembs; /* every thread's, for the sum */
} cnt_t;

/* A thread's blocks: queries and output gradients transposed, scores (or weights)
   and their gradients (CFK or CBK keys x ABQ), QE and dQE (npos x ABQ, position
   t's row of queries at t * ABQ), a block of outputs or of dq (ABQ x DV or D), and
   the row pointers acc_block reads. */
typedef struct {
    float *Qt, *dOt, *St, *dSt, *QEt, *dQEt, *O, *m, *l, *alpha, *lse, *delta;
    const float **krows, **qrows, **orows, **erows;
} cbuf_t;

#if defined(__GNUC__) && defined(__x86_64__)
#define HAVE_AVX512_COUNTED 1
#include "tiles.h"

/* What a key's score of 16 queries was made of, for the gradients. */
typedef struct {
    __m512 g, w, lo, hi; /* the gate, the weight of ceil p, QE at floor p and ceil p */
    __m512i il, ic;      /* the offsets of floor p and ceil p in QEt (+ 16 c) */
    __mmask16 open;      /* count <= npos - 1: p carries the gradient */
} part16_t;

/* Which of the 16 queries i0 + 16 c .. see key j: live lanes (< nq), not a padded key
   (dead), of key j's document, and, t = j - i0 - off, a query at or after it. */
AVX512 static inline __mmask16 keep16(const int32_t *qd, int32_t kd, int dead, Py_ssize_t i0,
                                      Py_ssize_t nq, Py_ssize_t c, Py_ssize_t t) {
    __mmask16 keep = (__mmask16)(nq - 16 * c >= 16 ? 0xffff : (1u << (nq - 16 * c)) - 1);
    if (dead) return 0;
    if (qd)
        keep = _mm512_mask_cmpeq_epi32_mask(keep, _mm512_maskz_loadu_epi32(keep, qd + i0 + 16 * c),
                                            _mm512_set1_epi32(kd));
    if (t > 16 * c) {
        __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        keep &= _mm512_cmp_epi32_mask(_mm512_add_epi32(lane, _mm512_set1_epi32((int)(16 * c))),
                                      _mm512_set1_epi32((int)t), _MM_CMPINT_NLT);
    }
    return keep;
}

/* The score of one key for 16 queries whose counts are still open (z the scaled dot
   products, keep the lanes that see the key, qe = QEt + 16 c): the gate is added to
   each lane's count (carry: the sum's compensation), and the position term read at
   the count. Masked lanes score
   -inf. The forward and both backward passes score through here, so the backward
   recomputes the forward's scores bit for bit. */
AVX512 static inline __m512 counted16(const cnt_t *a, __m512 z, __mmask16 keep, const float *qe,
                                      __m512 *count, __m512 *carry, part16_t *o) {
    __m512 one = _mm512_set1_ps(1.0f), top = _mm512_set1_ps((float)(a->npos - 1));
    /* sigmoid(z) = 1 / (1 + exp(-z)) for z >= 0, exp(z) / (1 + exp(z)) below: exp of
       -|z| only, which never overflows; a NaN z stays NaN */
    __m512 e = exp512(_mm512_castsi512_ps(
        _mm512_or_epi32(_mm512_castps_si512(z), _mm512_set1_epi32((int)0x80000000u))));
    __m512 r = _mm512_div_ps(one, _mm512_add_ps(one, e));
    __mmask16 up = _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_GE_OQ);
    __m512 g = _mm512_maskz_mov_ps(keep, _mm512_mask_mov_ps(_mm512_mul_ps(e, r), up, r));
    /* Kahan's compensated sum: the reference's cumsum accumulates in double, and a
       count of hundreds of gates summed in float32 drifts by as many roundings, each
       moving the score by the slope of the position term (|q| |e| per position) */
    __m512 y = _mm512_sub_ps(g, *carry), sum = _mm512_add_ps(*count, y);
    *carry = _mm512_sub_ps(_mm512_sub_ps(sum, *count), y);
    *count = sum;
    /* min_ps returns its second operand where either is NaN: a NaN count stays NaN
       and reads position 0 (its score is NaN through w anyway) */
    __m512 p = _mm512_min_ps(top, *count);
    __mmask16 ord = _mm512_cmp_ps_mask(p, p, _CMP_ORD_Q) & keep;
    __m512 fl = _mm512_roundscale_ps(p, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 ce = _mm512_roundscale_ps(p, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
    __m512 w = _mm512_sub_ps(p, fl);
    __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i il = _mm512_maskz_add_epi32(ord, _mm512_slli_epi32(_mm512_cvttps_epi32(fl), 6), lane);
    __m512i ic = _mm512_maskz_add_epi32(ord, _mm512_slli_epi32(_mm512_cvttps_epi32(ce), 6), lane);
    __m512 lo = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), keep, il, qe, 4);
    __m512 hi = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), keep, ic, qe, 4);
    /* as posenc.CoPE.forward: above * w + below * (1 - w) */
    __m512 bias = _mm512_add_ps(_mm512_mul_ps(hi, w), _mm512_mul_ps(lo, _mm512_sub_ps(one, w)));
    __m512 s = _mm512_add_ps(z, _mm512_mul_ps(bias, _mm512_set1_ps(a->factor)));
    o->g = g, o->w = w, o->lo = lo, o->hi = hi, o->il = il, o->ic = ic;
    o->open = _mm512_cmp_ps_mask(*count, top, _CMP_LE_OQ);
    return _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), keep, s);
}

/* Whether every live lane's count has reached npos - 1 (a NaN count never has):
   from here on the vector's keys all read QE[npos - 1] */
AVX512 static inline int clamped16(const cnt_t *a, __m512 count, Py_ssize_t nq, Py_ssize_t c) {
    __mmask16 cols = (__mmask16)(nq - 16 * c >= 16 ? 0xffff : (1u << (nq - 16 * c)) - 1);
    __mmask16 at = _mm512_cmp_ps_mask(count, _mm512_set1_ps((float)(a->npos - 1)), _CMP_GE_OQ);
    return (__mmask16)(at | ~cols) == 0xffff;
}

/* QE's rows (and, with dqe, dQE's, zeroed) up to those the next nk keys can reach
   from the largest count so far; returns how many rows there are now. */
AVX512 static Py_ssize_t qe_rows(const cnt_t *a, const cbuf_t *t, Py_ssize_t have, float most,
                                 Py_ssize_t nk, Py_ssize_t nv, int dqe) {
    Py_ssize_t need = a->npos;
    if (most < (float)a->npos) need = (Py_ssize_t)most + nk + 3; /* rounding's margin */
    if (need > a->npos) need = a->npos;
    if (need <= have) return have;
    scores_block(a->emb + have * a->D, a->D, need - have, t->Qt, a->D, nv, t->QEt + have * ABQ);
    if (dqe) memset(t->dQEt + have * ABQ, 0, sizeof(float) * (size_t)((need - have) * ABQ));
    return need;
}

/* The largest count of the open vectors (NaN, or above npos, where any is NaN). */
AVX512 static float most_count(const __m512 *count, const int *done, Py_ssize_t nv, float most) {
    for (Py_ssize_t c = 0; c < nv; ++c) {
        if (done[c]) continue;
        if (_mm512_cmp_ps_mask(count[c], count[c], _CMP_UNORD_Q)) return INFINITY;
        float x = _mm512_reduce_max_ps(count[c]);
        most = x > most ? x : most;
    }
    return most;
}

/* The unit's keys: up to the diagonal, and with documents those of its queries'. */
static void key_range(const cnt_t *a, Py_ssize_t b, Py_ssize_t i0, Py_ssize_t nq,
                      Py_ssize_t *kbeg, Py_ssize_t *kend, const int32_t **qd, const int32_t **kd) {
    *kbeg = 0;
    *kend = i0 + nq + a->off < a->LK ? i0 + nq + a->off : a->LK;
    *qd = *kd = NULL;
    if (a->qdoc) {
        *qd = a->qdoc + b * a->LQ, *kd = a->kdoc + b * a->LK;
        Py_ssize_t lo = first_at_least(*kd, a->LK, (*qd)[i0]);
        Py_ssize_t hi = first_at_least(*kd, a->LK, (int64_t)(*qd)[i0 + nq - 1] + 1);
        *kbeg = lo;
        *kend = hi < *kend ? hi : *kend;
    }
}

/* One forward unit: queries i0 .. i0 + nq - 1 of head h of batch b. */
AVX512 static void forward_unit(const cnt_t *a, Py_ssize_t b, Py_ssize_t h, Py_ssize_t i0,
                                const cbuf_t *t) {
    Py_ssize_t D = a->D, DV = a->DV, LQ = a->LQ, off = a->off;
    Py_ssize_t nq = LQ - i0 < ABQ ? LQ - i0 : ABQ, nv = (nq + 15) / 16, hk = h / (a->H / a->HK);
    const float *qb = a->q + b * a->qs[0] + h * a->qs[1] + i0 * a->qs[2];
    const float *kb = a->k + b * a->ks[0] + hk * a->ks[1];
    const float *vb = a->v + b * a->vs[0] + hk * a->vs[1];
    const uint8_t *mb = a->mask ? a->mask + b * a->LK : NULL;
    float *St = t->St, *O = t->O, *m = t->m, *l = t->l, *alpha = t->alpha;
    transpose_block(qb, a->qs[2], nq, D, t->Qt);
    for (Py_ssize_t ii = 0; ii < ABQ; ++ii) {
        m[ii] = -INFINITY;
        l[ii] = 0.0f;
    }
    memset(O, 0, sizeof(float) * (size_t)(ABQ * DV));
    Py_ssize_t kbeg, kend, have = 0;
    const int32_t *qd, *kd;
    key_range(a, b, i0, nq, &kbeg, &kend, &qd, &kd);
    __m512 ninf = _mm512_set1_ps(-INFINITY), scale = _mm512_set1_ps(a->scale);
    __m512 factor = _mm512_set1_ps(a->factor);
    __m512 zero = _mm512_setzero_ps(), count[4] = {zero, zero, zero, zero}, carry[4] = {zero, zero, zero, zero};
    int done[4] = {0, 0, 0, 0};
    float most = 0.0f;
    part16_t part;
    for (Py_ssize_t j1 = kend, j0; j1 > kbeg; j1 = j0) {
        j0 = j1 - CFK > kbeg ? j1 - CFK : kbeg;
        Py_ssize_t nk = j1 - j0;
        scores_block(kb + j0 * a->ks[2], a->ks[2], nk, t->Qt, D, nv, St);
        have = qe_rows(a, t, have, most, nk, nv, 0);
        __m512 cmax[4] = {ninf, ninf, ninf, ninf};
        for (Py_ssize_t jj = nk - 1; jj >= 0; --jj) {
            Py_ssize_t j = j0 + jj;
            int dead = mb != NULL && mb[j] == 0;
            for (Py_ssize_t c = 0; c < nv; ++c) {
                float *sp = St + jj * ABQ + 16 * c;
                __m512 z = _mm512_mul_ps(_mm512_load_ps(sp), scale), s;
                __mmask16 keep = keep16(qd, kd ? kd[j] : 0, dead, i0, nq, c, j - i0 - off);
                if (done[c]) {
                    __m512 last = _mm512_load_ps(t->QEt + (a->npos - 1) * ABQ + 16 * c);
                    s = _mm512_mask_mov_ps(ninf, keep, _mm512_add_ps(z, _mm512_mul_ps(last, factor)));
                } else {
                    s = counted16(a, z, keep, t->QEt + 16 * c, &count[c], &carry[c], &part);
                    done[c] = clamped16(a, count[c], nq, c);
                }
                _mm512_store_ps(sp, s);
                cmax[c] = _mm512_max_ps(cmax[c], s);
            }
        }
        most = most_count(count, done, nv, most);
        softmax_step(St, nk, nq, nv, cmax, m, l, alpha, O, DV);
        for (Py_ssize_t jj = 0; jj < nk; ++jj) t->krows[jj] = vb + (j0 + jj) * a->vs[2];
        acc_block(St, 0, nk, t->krows, nq, O, DV, DV);
    }
    float *ob = a->out + ((b * a->H + h) * LQ + i0) * DV;
    float *lb = a->lse + (b * a->H + h) * LQ + i0;
    for (Py_ssize_t ii = 0; ii < nq; ++ii) {
        int none = l[ii] == 0.0f; /* a query that sees no key */
        __m512 iv = _mm512_set1_ps(none ? 0.0f : 1.0f / l[ii]);
        for (Py_ssize_t c = 0; c < DV; c += 16)
            _mm512_storeu_ps(ob + ii * DV + c, _mm512_mul_ps(_mm512_loadu_ps(O + ii * DV + c), iv));
        lb[ii] = none ? -INFINITY : m[ii] + logf(l[ii]);
    }
}

/* One backward unit: queries i0 .. i0 + nq - 1 of head h of batch b, its two passes
   over the keys (see the header). */
AVX512 static void backward_unit(const cnt_t *a, Py_ssize_t b, Py_ssize_t h, Py_ssize_t i0,
                                 const cbuf_t *t) {
    Py_ssize_t D = a->D, DV = a->DV, LQ = a->LQ, H = a->H, off = a->off;
    Py_ssize_t nq = LQ - i0 < ABQ ? LQ - i0 : ABQ, nv = (nq + 15) / 16, hk = h / (H / a->HK);
    const float *qb = a->q + b * a->qs[0] + h * a->qs[1] + i0 * a->qs[2];
    const float *kb = a->k + b * a->ks[0] + hk * a->ks[1];
    const float *vb = a->v + b * a->vs[0] + hk * a->vs[1];
    const float *ob = a->dout + ((b * H + h) * LQ + i0) * DV;
    const float *lb = a->lse + (b * H + h) * LQ + i0, *db = a->delta + (b * H + h) * LQ + i0;
    const uint8_t *mb = a->mask ? a->mask + b * a->LK : NULL;
    float *dkb = a->dk + (b * a->HK + hk) * a->LK * D, *dvb = a->dv + (b * a->HK + hk) * a->LK * DV;
    transpose_block(qb, a->qs[2], nq, D, t->Qt);
    transpose_block(ob, DV, nq, DV, t->dOt);
    for (Py_ssize_t ii = 0; ii < ABQ; ++ii) {
        /* a query that sees no key (lse -inf) has only masked scores: any finite
           stand-in weighs them 0 */
        t->lse[ii] = ii < nq && lb[ii] != -INFINITY ? lb[ii] : 0.0f;
        t->delta[ii] = ii < nq ? db[ii] : 0.0f;
    }
    for (Py_ssize_t ii = 0; ii < nq; ++ii) {
        t->qrows[ii] = qb + ii * a->qs[2];
        t->orows[ii] = ob + ii * DV;
    }
    Py_ssize_t kbeg, kend, have = 0;
    const int32_t *qd, *kd;
    key_range(a, b, i0, nq, &kbeg, &kend, &qd, &kd);
    __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
    __m512 scale = _mm512_set1_ps(a->scale), factor = _mm512_set1_ps(a->factor);
    __m512 total[4] = {zero, zero, zero, zero};
    part16_t part;
    for (int pass = 0; pass < 2; ++pass) {
        /* pass 0: each query's total dp over its keys; pass 1: the gradients, with the
           dp of the keys after the current one summed in `later` */
        __m512 count[4] = {zero, zero, zero, zero}, carry[4] = {zero, zero, zero, zero};
        __m512 later[4] = {zero, zero, zero, zero};
        int done[4] = {0, 0, 0, 0};
        float most = 0.0f;
        if (pass) {
            memset(t->dQEt, 0, sizeof(float) * (size_t)(have * ABQ));
            memset(t->O, 0, sizeof(float) * (size_t)(ABQ * D));
        }
        for (Py_ssize_t j1 = kend, j0; j1 > kbeg; j1 = j0) {
            int open = 0;
            for (Py_ssize_t c = 0; c < nv; ++c) open |= !done[c];
            if (!pass && !open) break; /* every dp beyond is 0 */
            j0 = j1 - CBK > kbeg ? j1 - CBK : kbeg;
            Py_ssize_t nk = j1 - j0;
            for (Py_ssize_t jj = 0; jj < nk; ++jj) t->krows[jj] = kb + (j0 + jj) * a->ks[2];
            scores_block(kb + j0 * a->ks[2], a->ks[2], nk, t->Qt, D, nv, t->St);
            scores_block(vb + j0 * a->vs[2], a->vs[2], nk, t->dOt, DV, nv, t->dSt);
            have = qe_rows(a, t, have, most, nk, nv, pass);
            for (Py_ssize_t jj = nk - 1; jj >= 0; --jj) {
                Py_ssize_t j = j0 + jj;
                int dead = mb != NULL && mb[j] == 0;
                for (Py_ssize_t c = 0; c < nv; ++c) {
                    if (!pass && done[c]) continue;
                    float *sp = t->St + jj * ABQ + 16 * c, *dp = t->dSt + jj * ABQ + 16 * c;
                    __m512 z = _mm512_mul_ps(_mm512_load_ps(sp), scale), s;
                    __mmask16 keep = keep16(qd, kd ? kd[j] : 0, dead, i0, nq, c, j - i0 - off);
                    float *last = t->QEt + (a->npos - 1) * ABQ + 16 * c;
                    int fixed = done[c];
                    if (fixed)
                        s = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), keep,
                                               _mm512_add_ps(z, _mm512_mul_ps(_mm512_load_ps(last), factor)));
                    else
                        s = counted16(a, z, keep, t->QEt + 16 * c, &count[c], &carry[c], &part);
                    __m512 p = exp512(_mm512_sub_ps(s, _mm512_load_ps(t->lse + 16 * c)));
                    __m512 ds = _mm512_mul_ps(
                        p, _mm512_sub_ps(_mm512_load_ps(dp), _mm512_load_ps(t->delta + 16 * c)));
                    __m512 cf = _mm512_mul_ps(ds, factor), dz = ds;
                    if (fixed) { /* dp and dg are 0: all of dS goes to QE[npos - 1] */
                        float *g = t->dQEt + (a->npos - 1) * ABQ + 16 * c;
                        _mm512_store_ps(g, _mm512_add_ps(_mm512_load_ps(g), cf));
                    } else {
                        __m512 dpos = _mm512_maskz_mul_ps(part.open, cf, _mm512_sub_ps(part.hi, part.lo));
                        done[c] = clamped16(a, count[c], nq, c);
                        if (!pass) {
                            total[c] = _mm512_add_ps(total[c], dpos);
                            continue;
                        }
                        __m512 dg = _mm512_sub_ps(total[c], later[c]);
                        later[c] = _mm512_add_ps(later[c], dpos);
                        __m512 slope = _mm512_mul_ps(part.g, _mm512_sub_ps(one, part.g));
                        dz = _mm512_add_ps(ds, _mm512_mul_ps(dg, slope));
                        /* lanes are distinct queries: no two share an address */
                        float *qe = t->dQEt + 16 * c;
                        __m512 at = _mm512_mask_i32gather_ps(zero, keep, part.il, qe, 4);
                        at = _mm512_add_ps(at, _mm512_mul_ps(cf, _mm512_sub_ps(one, part.w)));
                        _mm512_mask_i32scatter_ps(qe, keep, part.il, at, 4);
                        at = _mm512_mask_i32gather_ps(zero, keep, part.ic, qe, 4);
                        at = _mm512_add_ps(at, _mm512_mul_ps(cf, part.w));
                        _mm512_mask_i32scatter_ps(qe, keep, part.ic, at, 4);
                    }
                    _mm512_store_ps(sp, p);
                    _mm512_store_ps(dp, dz);
                }
            }
            most = most_count(count, done, nv, most);
            if (!pass) continue;
            /* dv += P^T dO, dk += dz^T q (scaled in the sum), dq += dz k */
            acc_block(t->St, 1, nq, t->orows, nk, dvb + j0 * DV, DV, DV);
            acc_block(t->dSt, 1, nq, t->qrows, nk, dkb + j0 * D, D, D);
            acc_block(t->dSt, 0, nk, t->krows, nq, t->O, D, D);
        }
    }
    /* dq = dz k scale + dQE e^T; demb += (q^T dQE)^T, a row per position */
    __m512 sc = _mm512_set1_ps(a->scale);
    for (Py_ssize_t e = 0; e < nq * D; e += 16)
        _mm512_storeu_ps(t->O + e, _mm512_mul_ps(_mm512_loadu_ps(t->O + e), sc));
    acc_block(t->dQEt, 0, have, t->erows, nq, t->O, D, D);
    memcpy(a->dq + ((b * H + h) * LQ + i0) * D, t->O, sizeof(float) * (size_t)(nq * D));
    if (a->demb) acc_block(t->dQEt, 1, nq, t->qrows, have, a->demb, D, D);
}

/* A thread's blocks (the backward's with dout's and dQE's); 0 where out of memory. */
static char *buffers(const cnt_t *a, cbuf_t *t, int backward) {
    size_t D = (size_t)a->D, DV = (size_t)a->DV, P = (size_t)a->npos, K = backward ? CBK : CFK;
    size_t wide = D > DV ? D : DV;
    size_t floats = D * ABQ + (backward ? DV * ABQ + P * ABQ : 0) + 2 * K * ABQ + P * ABQ +
                    ABQ * wide + 5 * ABQ;
    char *buf = NULL;
    if (posix_memalign((void **)&buf, 64, sizeof(float) * floats + sizeof(float *) * (K + 2 * ABQ + P)))
        return NULL;
    float *f = (float *)buf;
    t->Qt = f, f += D * ABQ;
    t->dOt = backward ? f : NULL, f += backward ? DV * ABQ : 0;
    t->dQEt = backward ? f : NULL, f += backward ? P * ABQ : 0;
    t->St = f, f += K * ABQ;
    t->dSt = f, f += K * ABQ;
    t->QEt = f, f += P * ABQ;
    t->O = f, f += ABQ * wide;
    t->m = f, t->l = f + ABQ, t->alpha = f + 2 * ABQ, t->lse = f + 3 * ABQ, t->delta = f + 4 * ABQ;
    f += 5 * ABQ;
    t->krows = (const float **)f;
    t->qrows = t->krows + K;
    t->orows = t->qrows + ABQ;
    t->erows = t->orows + ABQ;
    for (size_t r = 0; r < P; ++r) t->erows[r] = a->emb + r * D;
    return buf;
}

/* Runs units taken in turn from the shared counter, the last query blocks (the most
   keys under the causal mask) first, which balances the threads. */
static void *counted_run(void *arg, int backward) {
    cnt_t *a = (cnt_t *)arg;
    if (backward)
        a->dk = a->dks[a->job.tid], a->dv = a->dvs[a->job.tid], a->demb = a->dembs[a->job.tid];
    cbuf_t t;
    char *buf = buffers(a, &t, backward);
    if (buf == NULL) {
        a->job.failed = 1;
        return NULL;
    }
    Py_ssize_t pairs = a->B * a->H, blocks = (a->LQ + ABQ - 1) / ABQ;
    unsigned int csr = flush_to_zero();
    for (;;) {
        Py_ssize_t u = __atomic_fetch_add(a->next, 1, __ATOMIC_RELAXED);
        if (u >= a->units) break;
        Py_ssize_t bh = u % pairs, i0 = (blocks - 1 - u / pairs) * ABQ;
        if (backward) backward_unit(a, bh / a->H, bh % a->H, i0, &t);
        else forward_unit(a, bh / a->H, bh % a->H, i0, &t);
    }
    _mm_setcsr(csr);
    free(buf);
    return NULL;
}

static void *forward_run(void *arg) { return counted_run(arg, 0); }
static void *backward_run(void *arg) { return counted_run(arg, 1); }

/* dk = (sum of the threads' dk) * scale, dv and demb the sums, for this thread's
   share of the elements. */
AVX512 static void *backward_sum(void *arg) {
    cnt_t *a = (cnt_t *)arg;
    sum_partials(a->dks, a->B * a->HK * a->LK * a->D, a->scale, &a->job);
    sum_partials(a->dvs, a->B * a->HK * a->LK * a->DV, 1.0f, &a->job);
    sum_partials(a->dembs, a->npos * a->D, 1.0f, &a->job);
    return NULL;
}
#endif

/* Reads the sizes, strides, positions, factor, scale, offset and documents that both
   functions take into a. */
static int read_counted(cnt_t *a, PyObject *sizes, PyObject *qstr, PyObject *kstr,
                        PyObject *vstr, Py_ssize_t npos, double factor, double scale,
                        int threads, Py_ssize_t off, PyObject *docs) {
    memset(a, 0, sizeof *a);
    Py_ssize_t sz[7];
    if (posenc_read_layout(sizes, 7, qstr, kstr, vstr, threads, sz, a->qs, a->ks, a->vs,
                           "attend_counted"))
        return -1;
    a->B = sz[0], a->H = sz[1], a->HK = sz[2], a->LQ = sz[3], a->LK = sz[4];
    a->D = sz[5], a->DV = sz[6];
    if (npos < 1 || npos > (1 << 20) || off < 0 || a->LQ + off > a->LK) {
        PyErr_SetString(PyExc_ValueError, "attend_counted: unsupported npos or offset");
        return -1;
    }
    a->npos = npos, a->factor = (float)factor, a->scale = (float)scale, a->off = off;
    return posenc_read_docs(docs, &a->qdoc, &a->kdoc);
}

PyObject *posenc_attend_counted(PyObject *self, PyObject *args) {
    unsigned long long qp, kp, vp, op, lp, ep, mp;
    PyObject *sizes, *qstr, *kstr, *vstr, *docs;
    Py_ssize_t npos, off;
    double factor, scale;
    int threads;
    if (!PyArg_ParseTuple(args, "KKKKKKKOOOOnddinO", &qp, &kp, &vp, &op, &lp, &ep, &mp, &sizes,
                          &qstr, &kstr, &vstr, &npos, &factor, &scale, &threads, &off, &docs))
        return NULL;
    cnt_t base;
    if (read_counted(&base, sizes, qstr, kstr, vstr, npos, factor, scale, threads, off, docs))
        return NULL;
#ifdef HAVE_AVX512_COUNTED
    if (!__builtin_cpu_supports("avx512f") || base.DV % 16) Py_RETURN_FALSE;
    base.q = (const float *)(uintptr_t)qp;
    base.k = (const float *)(uintptr_t)kp;
    base.v = (const float *)(uintptr_t)vp;
    base.out = (float *)(uintptr_t)op;
    base.lse = (float *)(uintptr_t)lp;
    base.emb = (const float *)(uintptr_t)ep;
    base.mask = (const uint8_t *)(uintptr_t)mp;
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
    (void)qp, (void)kp, (void)vp, (void)op, (void)lp, (void)ep, (void)mp;
    Py_RETURN_FALSE;
#endif
}

PyObject *posenc_attend_counted_backward(PyObject *self, PyObject *args) {
    unsigned long long qp, kp, vp, ep, mp, lp, gp, dp, dqp, dkp, dvp, dep;
    PyObject *sizes, *qstr, *kstr, *vstr, *docs;
    Py_ssize_t npos, off;
    double factor, scale;
    int threads;
    if (!PyArg_ParseTuple(args, "KKKKKKKKKKKKOOOOnddinO", &qp, &kp, &vp, &ep, &mp, &lp, &gp, &dp,
                          &dqp, &dkp, &dvp, &dep, &sizes, &qstr, &kstr, &vstr, &npos, &factor,
                          &scale, &threads, &off, &docs))
        return NULL;
    cnt_t base;
    if (read_counted(&base, sizes, qstr, kstr, vstr, npos, factor, scale, threads, off, docs))
        return NULL;
#ifdef HAVE_AVX512_COUNTED
    if (!__builtin_cpu_supports("avx512f") || base.DV % 16 || base.D % 16) Py_RETURN_FALSE;
    base.q = (const float *)(uintptr_t)qp;
    base.k = (const float *)(uintptr_t)kp;
    base.v = (const float *)(uintptr_t)vp;
    base.emb = (const float *)(uintptr_t)ep;
    base.mask = (const uint8_t *)(uintptr_t)mp;
    base.lse = (float *)(uintptr_t)lp;
    base.dout = (const float *)(uintptr_t)gp;
    base.delta = (const float *)(uintptr_t)dp;
    base.dq = (float *)(uintptr_t)dqp;
    base.units = base.B * base.H * ((base.LQ + ABQ - 1) / ABQ);
    if (threads > base.units) threads = (int)base.units;
    Py_ssize_t next = 0;
    base.next = &next;
    /* dk, dv and demb (zeroed by the caller) take thread 0's sums; the others get
       zeroed buffers of their own */
    size_t nk = (size_t)(base.B * base.HK * base.LK * base.D);
    size_t nv = (size_t)(base.B * base.HK * base.LK * base.DV), ne = (size_t)(npos * base.D);
    base.dks = posenc_partials((float *)(uintptr_t)dkp, nk, threads);
    base.dvs = posenc_partials((float *)(uintptr_t)dvp, nv, threads);
    base.dembs = posenc_partials((float *)(uintptr_t)dep, ne, threads);
    int failed = !base.dks || !base.dvs || !base.dembs;
    if (!failed) {
        Py_BEGIN_ALLOW_THREADS
        failed = posenc_launch(backward_run, &base, sizeof base, threads) ||
                 posenc_launch(backward_sum, &base, sizeof base, threads);
        Py_END_ALLOW_THREADS
    }
    posenc_partials_free(base.dks, threads);
    posenc_partials_free(base.dvs, threads);
    posenc_partials_free(base.dembs, threads);
    if (failed) return PyErr_NoMemory();
    Py_RETURN_TRUE;
#else
    (void)qp, (void)kp, (void)vp, (void)ep, (void)mp, (void)lp, (void)gp, (void)dp, (void)dqp,
        (void)dkp, (void)dvp, (void)dep;
    Py_RETURN_FALSE;
#endif
}
