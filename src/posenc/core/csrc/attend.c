/* attend(q, k, v, out, lse, table, mask, sizes, q_strides, k_strides, v_strides,
          causal, scale, threads, form, off, docs[, gate]) -> bool

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

   Query i sits at key position i + off (LK - LQ: bottom-right, as a KV cache
   has it; any other for a block of a longer sequence). score(i, j) = (q_i . k_j) * scale
   + bias, bias = table[h * (LQ + LK - 1) + LK - 1 - j + i] when table is not 0:
   the (H, LQ + LK - 1) table of posenc.integration.attention over key - query,
   reversed so that a key's row of queries reads it forwards. Keys j > i + off are
   masked when causal; keys with mask[b * LK + j] == 0 when mask is not 0; keys of
   another document than the query's when docs is (qdoc, kdoc), int32 (B, LQ) and (B,
   LK) document numbers that never decrease along a row (packed sequences): a
   block of queries then reads only the keys of its documents.

   gate (optional; None or 0 without) is the address of c (B, H, LK), C-contiguous,
   the cumulative sum of the log forget gates of the Forgetting Transformer (Lin et
   al. 2025): the score gains c[query's key position] - c[j], a per-query term minus
   a per-key term, added to each other first so that their difference, not two
   large numbers, meets the score.

   form is None, or the scaled form (scale, knots, slopes, intercepts, levels; see
   pw_t): then table is one reversed row (LQ + LK - 1) shared by the heads, and the
   bias is slopes[h, s] x + intercepts[h, s], x = table[..] * scale[i], s the count of
   knots below x.

   Returns False (doing nothing) where it has no loop for the input: without
   AVX-512, or DV not a multiple of 16. Work units (b, h, block of queries) go
   to the threads in turn, which balances causal blocks. exp is a Cephes-style
   polynomial (within 2 ulp); masked scores, and scores more than 87 below the
   query's maximum, weigh exactly 0. A NaN score weighs NaN, as does a +inf one
   (inf - inf), so the query's output row and lse are NaN, as softmax gives (a
   -inf score weighs 0); only a query that sees no key gets 0.

   attend_backward(q, k, v, lse, dout, delta, table, mask, dq, dk, dv, dtable, sizes,
                   q_strides, k_strides, v_strides, causal, scale, threads, form, off,
                   docs[, gate]) -> bool

   Its gradients, flash-attention-2 style (see backward_unit), from attend's lse and
   delta = rowsum(dout * out) (B, H, LQ), without a (B, H, LQ, LK) tensor. q, k,
   v, table, mask, sizes and strides as attend read them; dout (B, H, LQ, DV) is
   C-contiguous. Writes dk (B, HK, LK, D) and dv (B, HK, LK, DV), C-contiguous,
   and adds into dq (B, H, LQ, D) and dtable (H, LQ + LK - 1) (both C-contiguous
   and zeroed; dtable 0 when no table gradient is wanted): dtable is the gradient
   of the reversed table attend reads, the score gradient summed along each
   diagonal. With the scaled form, form adds the addresses of its gradients (dscale
   (LQ), dslopes and dintercepts (H, 64), zeroed; all 0 when dtable is 0) and dtable is
   the shared row's. With gate = (c, dcq, dck) (addresses; dcq (B, H, LQ) and dck (B, H,
   LK) zeroed), it adds each query's row sum of dS into dcq and each key's column sum
   into dck: the gradient of c is dcq at the queries' key positions minus dck. Returns False (doing nothing) without AVX-512, or D or DV not a
   multiple of 16. Memory beyond the outputs: a dq and a dtable (and dscale) per
   thread but the first, and the scaled form's (H, 64, 16) per-lane sums of dslopes
   and dintercepts per thread. The sums of dq and dtable over key blocks are taken in the order
   the threads take the blocks: equal to float32 rounding from run to run, not
   bit for bit. */

#include "common.h"

#define ABK 256 /* keys per block */

typedef struct {
    team_job_t job; /* first: posenc_launch numbers the copies */
    const float *q, *k, *v, *table;
    const uint8_t *mask;
    float *out, *lse;
    /* the scaled form (pw_* 0 without it): knots (64, ascending, +inf padded),
       slopes and intercepts (H, 64), row scale (LQ), the search's levels */
    const float *pw_scale, *pw_knots, *pw_slopes, *pw_inter;
    int pw_levels;
    Py_ssize_t off; /* query i sits at key position i + off */
    /* the document of each query (B, LQ) and key (B, LK), both nondecreasing along
       the sequence (0 without): a score is masked unless they are the same */
    const int32_t *qdoc, *kdoc;
    const float *gate; /* c (B, H, LK): score += c[i + off] - c[j] (0 without) */
    Py_ssize_t B, H, HK, LQ, LK, D, DV;
    Py_ssize_t qs[3], ks[3], vs[3];
    int causal;
    float scale;
    Py_ssize_t units;
} att_t;

#if defined(__GNUC__) && defined(__x86_64__)
#define HAVE_AVX512_ATTEND 1
#include "tiles.h"

/* The scaled form of a bias: bias_h(i, j) = F_h(x), x = table[key - query] *
   scale[i], F_h piecewise linear with knots t_0 <= .. shared by the heads: slope_h[s] x
   + intercept_h[s] on segment s = #{knots < x}. FIRE is one: x = psi(|i - j|) /
   psi(max(L, i)) and F its ReLU MLP (posenc.integration.attention builds the pieces).
   Up to 63 knots, padded to 64 with +inf, in four registers, as are one head's
   slopes and intercepts. */
typedef struct {
    __m512 knot[4], slope[4], inter[4];
    int levels; /* binary search steps: 2**levels > the number of knots */
} pw_t;

AVX512 static void pw_load(pw_t *f, const att_t *a, Py_ssize_t h) {
    for (int r = 0; r < 4; ++r) {
        f->knot[r] = _mm512_loadu_ps(a->pw_knots + 16 * r);
        f->slope[r] = _mm512_loadu_ps(a->pw_slopes + 64 * h + 16 * r);
        f->inter[r] = _mm512_loadu_ps(a->pw_inter + 64 * h + 16 * r);
    }
    f->levels = a->pw_levels;
}

/* t[idx] per lane for 64 entries in four registers, idx in 0 .. 63 */
AVX512 static inline __m512 lookup64(const __m512 *t, __m512i idx) {
    __m512 lo = _mm512_permutex2var_ps(t[0], idx, t[1]);
    __m512 hi = _mm512_permutex2var_ps(t[2], idx, t[3]);
    return _mm512_mask_mov_ps(lo, _mm512_test_epi32_mask(idx, _mm512_set1_epi32(32)), hi);
}

/* The segment of each lane's x: the count of knots below it (branch-free binary
   search; a NaN x compares false throughout and takes segment 0, whose NaN slope
   or intercept, if any, then shows) */
AVX512 static inline __m512i segment16(const pw_t *f, __m512 x) {
    __m512i idx = _mm512_setzero_si512();
    for (int step = (1 << f->levels) >> 1; step; step >>= 1) {
        __m512 knot = lookup64(f->knot, _mm512_add_epi32(idx, _mm512_set1_epi32(step - 1)));
        __mmask16 above = _mm512_cmp_ps_mask(x, knot, _CMP_GT_OQ);
        idx = _mm512_mask_add_epi32(idx, above, idx, _mm512_set1_epi32(step));
    }
    return idx;
}

/* The scores of key j for the 16 queries i0 + 16 c .. of a block (raw dot products
   at sp) as softmax sees them: scaled, biased, and -inf where masked (key j
   padding, a query before key j when causal, a lane past the nq queries). t = j -
   i0 - (LK - LQ): the queries ii < t of the block may not see key j. The bias is
   read from the table (tb: the head's row, or with pw the shared row of x's
   table) and, with the scaled form pw, made by it; its x and segment go to xo and
   io. With documents, qd is the batch's query documents and kd key j's. With a gate,
   cq is the head's c at the queries' key positions (cq[i]) and ck key j's. Forward and backward both score through here, so the backward recomputes
   the forward's scores bit for bit and exp(score - lse) are its weights. */
AVX512 static inline __m512 score16(const att_t *a, const float *sp, const float *tb,
                                    const pw_t *pw, const int32_t *qd, int32_t kd, int dead,
                                    const float *cq, float ck, Py_ssize_t j, Py_ssize_t i0,
                                    Py_ssize_t nq, Py_ssize_t c, Py_ssize_t t, __m512 *xo,
                                    __m512i *io) {
    __m512 s = _mm512_mul_ps(_mm512_load_ps(sp), _mm512_set1_ps(a->scale));
    __mmask16 cols = (__mmask16)(nq - 16 * c >= 16 ? 0xffff : (1u << (nq - 16 * c)) - 1);
    if (pw) {
        __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(cols, tb + a->LK - 1 - j + i0 + 16 * c),
                                 _mm512_maskz_loadu_ps(cols, a->pw_scale + i0 + 16 * c));
        __m512i idx = segment16(pw, x);
        s = _mm512_add_ps(s, _mm512_fmadd_ps(lookup64(pw->slope, idx), x, lookup64(pw->inter, idx)));
        *xo = x;
        *io = idx;
    } else if (tb)
        s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(cols, tb + a->LK - 1 - j + i0 + 16 * c));
    if (cq)
        s = _mm512_add_ps(s, _mm512_sub_ps(_mm512_maskz_loadu_ps(cols, cq + i0 + 16 * c),
                                           _mm512_set1_ps(ck)));
    __mmask16 keep = dead ? 0 : cols;
    if (qd) /* the block's queries' documents against key j's */
        keep = _mm512_mask_cmpeq_epi32_mask(keep, _mm512_maskz_loadu_epi32(cols, qd + i0 + 16 * c),
                                            _mm512_set1_epi32(kd));
    if (a->causal && t > 16 * c) {
        __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        keep &= _mm512_cmp_epi32_mask(_mm512_add_epi32(lane, _mm512_set1_epi32((int)(16 * c))),
                                      _mm512_set1_epi32((int)t), _MM_CMPINT_NLT);
    }
    return _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), keep, s);
}

/* One unit: queries i0 .. i0 + nq - 1 of head h of batch b. */
AVX512 static void attend_unit(const att_t *a, Py_ssize_t b, Py_ssize_t h, Py_ssize_t i0,
                               float *Qt, float *St, float *O, float *m, float *l,
                               float *alpha, const float **rows) {
    Py_ssize_t D = a->D, DV = a->DV, LK = a->LK, LQ = a->LQ;
    Py_ssize_t nq = LQ - i0 < ABQ ? LQ - i0 : ABQ, nv = (nq + 15) / 16;
    Py_ssize_t off = a->off, hk = h / (a->H / a->HK);
    const float *qb = a->q + b * a->qs[0] + h * a->qs[1] + i0 * a->qs[2];
    const float *kb = a->k + b * a->ks[0] + hk * a->ks[1];
    const float *vb = a->v + b * a->vs[0] + hk * a->vs[1];
    /* the scaled form reads one table of x shared by the heads */
    const float *tb = a->table ? a->table + (a->pw_knots ? 0 : h) * (LQ + LK - 1) : NULL;
    pw_t pwh, *pw = NULL;
    if (a->pw_knots) pw_load(pw = &pwh, a, h);
    __m512 x = _mm512_setzero_ps(); /* x and segment: the scaled form's, unused here */
    __m512i seg = _mm512_setzero_si512();
    const uint8_t *mb = a->mask ? a->mask + b * LK : NULL;
    const float *cg = a->gate ? a->gate + (b * a->H + h) * LK : NULL, *cq = cg ? cg + off : NULL;
    transpose_block(qb, a->qs[2], nq, D, Qt);
    for (Py_ssize_t ii = 0; ii < ABQ; ++ii) {
        m[ii] = -INFINITY;
        l[ii] = 0.0f;
    }
    memset(O, 0, sizeof(float) * (size_t)(ABQ * DV));
    Py_ssize_t kbeg = 0, kend = LK;
    if (a->causal && i0 + nq + off < kend) kend = i0 + nq + off;
    const int32_t *qd = NULL, *kd = NULL;
    if (a->qdoc) { /* only the keys of the block's documents */
        qd = a->qdoc + b * LQ, kd = a->kdoc + b * LK;
        Py_ssize_t lo = first_at_least(kd, LK, qd[i0]), hi = first_at_least(kd, LK, (int64_t)qd[i0 + nq - 1] + 1);
        kbeg = lo > kbeg ? lo : kbeg;
        kend = hi < kend ? hi : kend;
    }
    __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (Py_ssize_t j0 = kbeg; j0 < kend; j0 += ABK) {
        Py_ssize_t nk = kend - j0 < ABK ? kend - j0 : ABK, jj;
        scores_block(kb + j0 * a->ks[2], a->ks[2], nk, Qt, D, nv, St);
        /* scale, bias, mask; the maximum of each query over this block */
        __m512 cmax[4] = {ninf, ninf, ninf, ninf};
        for (jj = 0; jj < nk; ++jj) {
            Py_ssize_t j = j0 + jj;
            int dead = mb != NULL && mb[j] == 0;
            for (Py_ssize_t c = 0; c < nv; ++c) {
                float *sp = St + jj * ABQ + 16 * c;
                __m512 s = score16(a, sp, tb, pw, qd, kd ? kd[j] : 0, dead, cq, cg ? cg[j] : 0.0f,
                                   j, i0, nq, c, j - i0 - off, &x, &seg);
                _mm512_store_ps(sp, s);
                cmax[c] = _mm512_max_ps(cmax[c], s);
            }
        }
        softmax_step(St, nk, nq, nv, cmax, m, l, alpha, O, DV);
        /* O += P V */
        for (jj = 0; jj < nk; ++jj) rows[jj] = vb + (j0 + jj) * a->vs[2];
        acc_block(St, 0, nk, rows, nq, O, DV, DV);
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
        a->job.failed = 1;
        return NULL;
    }
    float *Qt = (float *)buf, *St = (float *)(buf + qt), *O = (float *)(buf + qt + st);
    float *m = (float *)(buf + qt + st + o), *l = m + ABQ, *alpha = l + ABQ;
    const float **rows = (const float **)(alpha + ABQ);
    Py_ssize_t blocks = (a->LQ + ABQ - 1) / ABQ;
    unsigned int csr = flush_to_zero();
    for (Py_ssize_t u = a->job.tid; u < a->units; u += a->job.nthreads) {
        Py_ssize_t qb = u % blocks, bh = u / blocks;
        attend_unit(a, bh / a->H, bh % a->H, qb * ABQ, Qt, St, O, m, l, alpha, rows);
    }
    _mm_setcsr(csr);
    free(buf);
    return NULL;
}

/* The backward (flash-attention 2): a unit owns a block of BBK keys of one kv head
   of one batch and, for each head of its group and each block of ABQ queries that
   can see those keys, recomputes the weights P = exp(score - lse) and adds

       dV += P^T dO,  dS = P (dO V^T - delta),  dK += dS^T Q,  dQ += dS K,

   and dS along its diagonals into the table's gradient. dK and dV of the block are
   the unit's alone; dQ and the table gradient gather from every key block, so each
   thread adds them into its own buffer (thread 0 into the outputs), summed after. */
#define BBK 64 /* keys per backward unit: P and dS blocks of BBK x ABQ stay in L1/L2 */

typedef struct {
    att_t a; /* q, k, v, table, mask, lse, sizes, strides, causal, scale */
    const float *dout, *delta;
    float *dk, *dv;
    float *dq, *dtab;   /* this thread's: (B, H, LQ, D) and (H, LQ + LK - 1) */
    /* the scaled form's (0 without it): this thread's gradient of the row scale (LQ)
       and its sums of dS x and dS per head, segment and lane (H, 64, 16) */
    float *dw, *dsl, *din;
    /* the gate's (0 without): this thread's row sums of dS (B, H, LQ), and the
       column sums (B, H, LK), each key's written by the unit that owns it */
    float *dcq, *dck;
    float **dqs, **dtabs, **dws, **dcqs; /* every thread's, for the sum */
    float **sums;       /* every thread's dsl, din after it (H, 64, 16) each */
    Py_ssize_t *next;   /* the next unit to take, shared */
} bwd_t;

typedef struct {
    float *Qt, *dOt, *St, *dSt, *dK, *dV, *lse, *delta;
    const float **krows, **qrows, **orows;
} bwd_buf_t;

/* One unit: keys j0 .. j0 + nk - 1 of kv head hk of batch b. */
AVX512 static void backward_unit(const bwd_t *w, Py_ssize_t b, Py_ssize_t hk, Py_ssize_t j0,
                                 const bwd_buf_t *t) {
    const att_t *a = &w->a;
    Py_ssize_t D = a->D, DV = a->DV, LK = a->LK, LQ = a->LQ, H = a->H, off = a->off;
    Py_ssize_t nk = LK - j0 < BBK ? LK - j0 : BBK, group = H / a->HK;
    const float *kb = a->k + b * a->ks[0] + hk * a->ks[1] + j0 * a->ks[2];
    const float *vb = a->v + b * a->vs[0] + hk * a->vs[1] + j0 * a->vs[2];
    const uint8_t *mb = a->mask ? a->mask + b * LK : NULL;
    for (Py_ssize_t jj = 0; jj < nk; ++jj) t->krows[jj] = kb + jj * a->ks[2];
    memset(t->dK, 0, sizeof(float) * (size_t)(BBK * D));
    memset(t->dV, 0, sizeof(float) * (size_t)(BBK * DV));
    /* causal: queries before j0 - off see none of these keys; with documents, only
       the queries of the block's documents do */
    Py_ssize_t first = a->causal && j0 > off ? (j0 - off) / ABQ * ABQ : 0, qend = LQ;
    const int32_t *qd = NULL, *kd = NULL;
    if (a->qdoc) {
        qd = a->qdoc + b * LQ, kd = a->kdoc + b * LK;
        Py_ssize_t lo = first_at_least(qd, LQ, kd[j0]) / ABQ * ABQ;
        first = lo > first ? lo : first;
        qend = first_at_least(qd, LQ, (int64_t)kd[j0 + nk - 1] + 1);
    }
    Py_ssize_t rows = a->pw_knots ? 0 : 1; /* the scaled form's table is shared */
    __m512 zero = _mm512_setzero_ps();
    __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (Py_ssize_t h = hk * group; h < (hk + 1) * group; ++h) {
        const float *tb = a->table ? a->table + rows * h * (LQ + LK - 1) : NULL;
        float *dtb = w->dtab ? w->dtab + rows * h * (LQ + LK - 1) : NULL;
        pw_t pwh, *pw = NULL;
        if (a->pw_knots) pw_load(pw = &pwh, a, h);
        const float *cg = a->gate ? a->gate + (b * H + h) * LK : NULL, *cq = cg ? cg + off : NULL;
        float *dck = cg ? w->dck + (b * H + h) * LK : NULL;
        for (Py_ssize_t i0 = first; i0 < qend; i0 += ABQ) {
            Py_ssize_t nq = LQ - i0 < ABQ ? LQ - i0 : ABQ, nv = (nq + 15) / 16;
            const float *qb = a->q + b * a->qs[0] + h * a->qs[1] + i0 * a->qs[2];
            const float *ob = w->dout + ((b * H + h) * LQ + i0) * DV;
            const float *lb = a->lse + (b * H + h) * LQ + i0, *db = w->delta + (b * H + h) * LQ + i0;
            transpose_block(qb, a->qs[2], nq, D, t->Qt);
            transpose_block(ob, DV, nq, DV, t->dOt);
            for (Py_ssize_t ii = 0; ii < ABQ; ++ii) {
                /* a query that sees no key (lse -inf) has only masked scores: any
                   finite stand-in weighs them 0 */
                t->lse[ii] = ii < nq && lb[ii] != -INFINITY ? lb[ii] : 0.0f;
                t->delta[ii] = ii < nq ? db[ii] : 0.0f;
            }
            for (Py_ssize_t ii = 0; ii < nq; ++ii) {
                t->qrows[ii] = qb + ii * a->qs[2];
                t->orows[ii] = ob + ii * DV;
            }
            scores_block(kb, a->ks[2], nk, t->Qt, D, nv, t->St);
            scores_block(vb, a->vs[2], nk, t->dOt, DV, nv, t->dSt);
            __m512 dwsum[4] = {zero, zero, zero, zero}, rsum[4] = {zero, zero, zero, zero};
            for (Py_ssize_t jj = 0; jj < nk; ++jj) {
                Py_ssize_t j = j0 + jj;
                int dead = mb != NULL && mb[j] == 0;
                __m512 csum = zero; /* key j's dS over the block's queries */
                for (Py_ssize_t c = 0; c < nv; ++c) {
                    float *sp = t->St + jj * ABQ + 16 * c, *dp = t->dSt + jj * ABQ + 16 * c;
                    __m512 x = _mm512_setzero_ps();
                    __m512i seg = _mm512_setzero_si512();
                    __m512 s = score16(a, sp, tb, pw, qd, kd ? kd[j] : 0, dead, cq,
                                       cg ? cg[j] : 0.0f, j, i0, nq, c, j - i0 - off, &x, &seg);
                    __m512 p = exp512(_mm512_sub_ps(s, _mm512_load_ps(t->lse + 16 * c)));
                    __m512 ds = _mm512_mul_ps(
                        p, _mm512_sub_ps(_mm512_load_ps(dp), _mm512_load_ps(t->delta + 16 * c)));
                    _mm512_store_ps(sp, p);
                    _mm512_store_ps(dp, ds);
                    if (cg) { /* masked lanes and lanes past nq weigh 0: their dS is 0 */
                        rsum[c] = _mm512_add_ps(rsum[c], ds);
                        csum = _mm512_add_ps(csum, ds);
                    }
                    if (!dtb) continue;
                    /* the reversed table: queries of key j read it forwards */
                    float *g = dtb + LK - 1 - j + i0 + 16 * c;
                    __mmask16 cols =
                        (__mmask16)(nq - 16 * c >= 16 ? 0xffff : (1u << (nq - 16 * c)) - 1);
                    __m512 gt = ds;
                    if (pw) {
                        /* bias = slope x + intercept, x = table * scale: dS slope
                           reaches the table times the scale and the scale times the
                           table; dS x and dS the segment's slope and intercept,
                           summed per lane (no two lanes share an address) */
                        __m512 sd = _mm512_mul_ps(ds, lookup64(pw->slope, seg));
                        gt = _mm512_mul_ps(sd, _mm512_maskz_loadu_ps(cols, a->pw_scale + i0 + 16 * c));
                        dwsum[c] = _mm512_fmadd_ps(sd, _mm512_maskz_loadu_ps(cols, tb + LK - 1 - j + i0 + 16 * c),
                                                   dwsum[c]);
                        __m512i at = _mm512_add_epi32(_mm512_slli_epi32(seg, 4), lane);
                        float *bs = w->dsl + h * 1024, *bi = w->din + h * 1024;
                        _mm512_i32scatter_ps(bs, at, _mm512_fmadd_ps(ds, x, _mm512_i32gather_ps(at, bs, 4)), 4);
                        _mm512_i32scatter_ps(bi, at, _mm512_add_ps(ds, _mm512_i32gather_ps(at, bi, 4)), 4);
                    }
                    _mm512_mask_storeu_ps(g, cols, _mm512_add_ps(_mm512_maskz_loadu_ps(cols, g), gt));
                }
                if (cg) dck[j] += _mm512_reduce_add_ps(csum);
            }
            if (cg)
                for (Py_ssize_t c = 0; c < nv; ++c) {
                    __mmask16 cols =
                        (__mmask16)(nq - 16 * c >= 16 ? 0xffff : (1u << (nq - 16 * c)) - 1);
                    float *g = w->dcq + (b * H + h) * LQ + i0 + 16 * c;
                    _mm512_mask_storeu_ps(g, cols, _mm512_add_ps(_mm512_maskz_loadu_ps(cols, g), rsum[c]));
                }
            if (pw && dtb)
                for (Py_ssize_t c = 0; c < nv; ++c) {
                    __mmask16 cols =
                        (__mmask16)(nq - 16 * c >= 16 ? 0xffff : (1u << (nq - 16 * c)) - 1);
                    float *g = w->dw + i0 + 16 * c;
                    _mm512_mask_storeu_ps(g, cols, _mm512_add_ps(_mm512_maskz_loadu_ps(cols, g), dwsum[c]));
                }
            acc_block(t->St, 1, nq, t->orows, nk, t->dV, DV, DV);
            acc_block(t->dSt, 1, nq, t->qrows, nk, t->dK, D, D);
            acc_block(t->dSt, 0, nk, t->krows, nq, w->dq + ((b * H + h) * LQ + i0) * D, D, D);
        }
    }
    float *dkb = w->dk + ((b * a->HK + hk) * LK + j0) * D;
    float *dvb = w->dv + ((b * a->HK + hk) * LK + j0) * DV;
    __m512 scale = _mm512_set1_ps(a->scale);
    for (Py_ssize_t e = 0; e < nk * D; e += 16)
        _mm512_storeu_ps(dkb + e, _mm512_mul_ps(_mm512_load_ps(t->dK + e), scale));
    memcpy(dvb, t->dV, sizeof(float) * (size_t)(nk * DV));
}

static void *backward_run(void *arg) {
    bwd_t *w = (bwd_t *)arg;
    const att_t *a = &w->a;
    int i = a->job.tid;
    w->dq = w->dqs[i], w->dtab = w->dtabs[i], w->dw = w->dws[i], w->dcq = w->dcqs[i];
    w->dsl = w->sums[i], w->din = w->sums[i] ? w->sums[i] + a->H * 64 * 16 : NULL;
    size_t f = sizeof(float), D = (size_t)a->D, DV = (size_t)a->DV;
    size_t floats = D * ABQ + DV * ABQ + 2 * BBK * ABQ + BBK * D + BBK * DV + 2 * ABQ;
    char *buf = NULL;
    if (posix_memalign((void **)&buf, 64, f * floats + sizeof(float *) * (BBK + 2 * ABQ))) {
        w->a.job.failed = 1;
        return NULL;
    }
    bwd_buf_t t;
    t.Qt = (float *)buf;
    t.dOt = t.Qt + D * ABQ;
    t.St = t.dOt + DV * ABQ;
    t.dSt = t.St + BBK * ABQ;
    t.dK = t.dSt + BBK * ABQ;
    t.dV = t.dK + BBK * D;
    t.lse = t.dV + BBK * DV;
    t.delta = t.lse + ABQ;
    t.krows = (const float **)(t.delta + ABQ);
    t.qrows = t.krows + BBK;
    t.orows = t.qrows + ABQ;
    Py_ssize_t pairs = a->B * a->HK;
    unsigned int csr = flush_to_zero();
    for (;;) {
        /* units in order of key block: under a causal mask the first blocks have the
           most queries, so taking them first (longest first) balances the threads */
        Py_ssize_t u = __atomic_fetch_add(w->next, 1, __ATOMIC_RELAXED);
        if (u >= a->units) break;
        Py_ssize_t bh = u % pairs;
        backward_unit(w, bh / a->HK, bh % a->HK, u / pairs * BBK, &t);
    }
    _mm_setcsr(csr);
    free(buf);
    return NULL;
}

/* dq[e] = (sum of the threads' dq[e]) * scale and the table's, the row scale's and the
   gate's row sums likewise (unscaled), for this thread's share of the elements. */
AVX512 static void *backward_sum(void *arg) {
    bwd_t *w = (bwd_t *)arg;
    const att_t *a = &w->a;
    sum_partials(w->dqs, a->B * a->H * a->LQ * a->D, a->scale, &a->job);
    sum_partials(w->dtabs, (a->pw_knots ? 1 : a->H) * (a->LQ + a->LK - 1), 1.0f, &a->job);
    sum_partials(w->dws, a->LQ, 1.0f, &a->job);
    sum_partials(w->dcqs, a->B * a->H * a->LQ, 1.0f, &a->job);
    return NULL;
}
#endif

/* Reads and checks the sizes and strides both functions take into base. */
static int read_shapes(att_t *base, PyObject *sizes, PyObject *qstr, PyObject *kstr,
                       PyObject *vstr, int threads) {
    memset(base, 0, sizeof *base);
    Py_ssize_t sz[7];
    if (posenc_read_layout(sizes, 7, qstr, kstr, vstr, threads, sz, base->qs, base->ks, base->vs,
                           "attend"))
        return -1;
    base->B = sz[0], base->H = sz[1], base->HK = sz[2], base->LQ = sz[3], base->LK = sz[4];
    base->D = sz[5], base->DV = sz[6];
    return 0;
}

/* Reads the scaled form (None, or (scale, knots, slopes, intercepts, levels) as
   addresses and an int, then with want_grads the addresses of its gradients (dw,
   dslopes, dintercepts)) into a; grads gets those. */
static int read_form(att_t *a, PyObject *form, int want_grads, unsigned long long *grads) {
    if (form == Py_None) return 0;
    unsigned long long sp, kp, lp, ip;
    int levels;
    grads[0] = grads[1] = grads[2] = 0;
    int ok = want_grads ? PyArg_ParseTuple(form, "KKKKiKKK", &sp, &kp, &lp, &ip, &levels,
                                           &grads[0], &grads[1], &grads[2])
                        : PyArg_ParseTuple(form, "KKKKi", &sp, &kp, &lp, &ip, &levels);
    if (!ok) return -1;
    if (levels < 0 || levels > 6 || !a->table) {
        PyErr_SetString(PyExc_ValueError, "attend: the scaled form needs a table and 0..6 levels");
        return -1;
    }
    a->pw_scale = (const float *)(uintptr_t)sp;
    a->pw_knots = (const float *)(uintptr_t)kp;
    a->pw_slopes = (const float *)(uintptr_t)lp;
    a->pw_inter = (const float *)(uintptr_t)ip;
    a->pw_levels = levels;
    return 0;
}

/* Reads the query offset and the documents (None or (qdoc, kdoc) addresses) into a. */
static int read_place(att_t *a, Py_ssize_t off, PyObject *docs) {
    a->off = off;
    return posenc_read_docs(docs, &a->qdoc, &a->kdoc);
}

/* Reads the gate: None (or 0), c's address, or with want_grads (c, dcq, dck). */
static int read_gate(att_t *a, PyObject *gate, int want_grads, unsigned long long *grads) {
    unsigned long long cp = 0;
    grads[0] = grads[1] = 0;
    if (gate == Py_None) return 0;
    if (want_grads) {
        if (!PyArg_ParseTuple(gate, "KKK", &cp, &grads[0], &grads[1])) return -1;
    } else {
        cp = PyLong_AsUnsignedLongLong(gate);
        if (PyErr_Occurred()) return -1;
    }
    if (cp && (a->off < 0 || (want_grads && !(grads[0] && grads[1])))) {
        PyErr_SetString(PyExc_ValueError, "attend: the gate needs off >= 0 and its gradients");
        return -1;
    }
    a->gate = (const float *)(uintptr_t)cp;
    return 0;
}

PyObject *posenc_attend(PyObject *self, PyObject *args) {
    unsigned long long qp, kp, vp, op, lp, tp, mp, unused[3];
    PyObject *sizes, *qstr, *kstr, *vstr, *form, *docs, *gate = Py_None;
    int causal, threads;
    double scale;
    Py_ssize_t off;
    if (!PyArg_ParseTuple(args, "KKKKKKKOOOOpdiOnO|O", &qp, &kp, &vp, &op, &lp, &tp, &mp, &sizes,
                          &qstr, &kstr, &vstr, &causal, &scale, &threads, &form, &off, &docs,
                          &gate))
        return NULL;
    att_t base;
    if (read_shapes(&base, sizes, qstr, kstr, vstr, threads)) return NULL;
    base.table = (const float *)(uintptr_t)tp;
    if (read_form(&base, form, 0, unused) || read_place(&base, off, docs) ||
        read_gate(&base, gate, 0, unused))
        return NULL;
#ifdef HAVE_AVX512_ATTEND
    if (!__builtin_cpu_supports("avx512f") || base.DV % 16) Py_RETURN_FALSE;
    base.q = (const float *)(uintptr_t)qp;
    base.k = (const float *)(uintptr_t)kp;
    base.v = (const float *)(uintptr_t)vp;
    base.out = (float *)(uintptr_t)op;
    base.lse = (float *)(uintptr_t)lp;
    base.mask = (const uint8_t *)(uintptr_t)mp;
    base.causal = causal;
    base.scale = (float)scale;
    base.units = base.B * base.H * ((base.LQ + ABQ - 1) / ABQ);
    if (threads > base.units) threads = (int)base.units;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = posenc_launch(attend_run, &base, sizeof base, threads);
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    Py_RETURN_TRUE;
#else
    (void)qp, (void)kp, (void)vp, (void)op, (void)lp, (void)mp, (void)causal, (void)scale;
    Py_RETURN_FALSE;
#endif
}

PyObject *posenc_attend_backward(PyObject *self, PyObject *args) {
    unsigned long long qp, kp, vp, lp, gp, dp, tp, mp, dqp, dkp, dvp, dtp, fg[3], gg[2];
    PyObject *sizes, *qstr, *kstr, *vstr, *form, *docs, *gate = Py_None;
    int causal, threads;
    double scale;
    Py_ssize_t off;
    if (!PyArg_ParseTuple(args, "KKKKKKKKKKKKOOOOpdiOnO|O", &qp, &kp, &vp, &lp, &gp, &dp, &tp,
                          &mp, &dqp, &dkp, &dvp, &dtp, &sizes, &qstr, &kstr, &vstr, &causal,
                          &scale, &threads, &form, &off, &docs, &gate))
        return NULL;
    bwd_t base;
    memset(&base, 0, sizeof base);
    if (read_shapes(&base.a, sizes, qstr, kstr, vstr, threads)) return NULL;
    base.a.table = (const float *)(uintptr_t)tp;
    if (read_form(&base.a, form, 1, fg) || read_place(&base.a, off, docs) ||
        read_gate(&base.a, gate, 1, gg))
        return NULL;
    int scaled = base.a.pw_knots != NULL;
    if (scaled && dtp && !(fg[0] && fg[1] && fg[2])) {
        PyErr_SetString(PyExc_ValueError, "attend_backward: the scaled form's gradients are missing");
        return NULL;
    }
#ifdef HAVE_AVX512_ATTEND
    if (!__builtin_cpu_supports("avx512f") || base.a.DV % 16 || base.a.D % 16) Py_RETURN_FALSE;
    base.a.q = (const float *)(uintptr_t)qp;
    base.a.k = (const float *)(uintptr_t)kp;
    base.a.v = (const float *)(uintptr_t)vp;
    base.a.lse = (float *)(uintptr_t)lp;
    base.a.mask = (const uint8_t *)(uintptr_t)mp;
    base.a.causal = causal;
    base.a.scale = (float)scale;
    base.a.units = base.a.B * base.a.HK * ((base.a.LK + BBK - 1) / BBK);
    base.dout = (const float *)(uintptr_t)gp;
    base.delta = (const float *)(uintptr_t)dp;
    base.dk = (float *)(uintptr_t)dkp;
    base.dv = (float *)(uintptr_t)dvp;
    base.dck = (float *)(uintptr_t)gg[1];
    if (threads > base.a.units) threads = (int)base.a.units;
    Py_ssize_t next = 0;
    base.next = &next;
    /* dq, dtab, dw and dcq (zeroed by the caller) take thread 0's sums; the others get
       zeroed buffers of their own. The segment sums are per thread and lane, every
       thread's its own, added into the caller's (H, 64) afterwards. */
    int segs = scaled && dtp, gated = base.a.gate != NULL;
    size_t nt = (size_t)((scaled ? 1 : base.a.H) * (base.a.LQ + base.a.LK - 1));
    size_t nq = (size_t)(base.a.B * base.a.H * base.a.LQ), ns = (size_t)(base.a.H * 64 * 16);
    base.dqs = posenc_partials((float *)(uintptr_t)dqp, nq * (size_t)base.a.D, threads);
    base.dtabs = posenc_partials((float *)(uintptr_t)dtp, nt, threads);
    base.dws = posenc_partials(segs ? (float *)(uintptr_t)fg[0] : NULL, (size_t)base.a.LQ, threads);
    base.dcqs = posenc_partials(gated ? (float *)(uintptr_t)gg[0] : NULL, nq, threads);
    base.sums = (float **)calloc((size_t)threads, sizeof(float *));
    int failed = !base.dqs || !base.dtabs || !base.dws || !base.dcqs || !base.sums;
    for (int i = 0; i < threads && segs && !failed; ++i)
        failed |= (base.sums[i] = (float *)calloc(2 * ns, sizeof(float))) == NULL;
    if (!failed) {
        Py_BEGIN_ALLOW_THREADS
        failed = posenc_launch(backward_run, &base, sizeof base, threads) ||
                 posenc_launch(backward_sum, &base, sizeof base, threads);
        if (!failed && segs) {
            float *dsl = (float *)(uintptr_t)fg[1], *din = (float *)(uintptr_t)fg[2];
            for (int i = 0; i < threads; ++i)
                for (size_t e = 0; e < ns; ++e) {
                    dsl[e / 16] += base.sums[i][e];
                    din[e / 16] += base.sums[i][ns + e];
                }
        }
        Py_END_ALLOW_THREADS
    }
    for (int i = 0; base.sums && i < threads; ++i) free(base.sums[i]);
    free(base.sums);
    posenc_partials_free(base.dqs, threads);
    posenc_partials_free(base.dtabs, threads);
    posenc_partials_free(base.dws, threads);
    posenc_partials_free(base.dcqs, threads);
    if (failed) return PyErr_NoMemory();
    Py_RETURN_TRUE;
#else
    (void)qp, (void)kp, (void)vp, (void)lp, (void)gp, (void)dp, (void)mp, (void)dqp, (void)dkp,
        (void)dvp, (void)dtp, (void)causal, (void)scale, (void)scaled, (void)gg;
    Py_RETURN_FALSE;
#endif
}
