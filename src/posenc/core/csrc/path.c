/* path_core(qhat, khat, v, hmat, intra, gate, docs, first, out, lse, sizes, threads) -> bool

   The core of posenc.integration.attention.path (_PaTHCore) for float32 CPU tensors:
   the scores of each query chunk against its own and every earlier key chunk, the
   softmax and the values, one unit of at most ABQ queries at a time, nothing
   quadratic held. Addresses as ints, every tensor C-contiguous, chunk first;
   sizes = [N, BK, G, C, D, DV] (N chunks of C positions, BK = batch * kv_heads, G
   query heads per kv head):

       qhat  (N, BK, G C, D)   queries carried to their chunk's start, scaled
       khat  (N, BK, C, D)     keys carried to their chunk's end
       v     (N, BK, C, DV)
       hmat  (N, BK, D, D)     chunk j's product of transforms is I - hmat[j]
       intra (N, BK, G C, C)   the scores within each chunk, scaled
       gate  (N, BK, G, C)     cumulative log forget gates, scaled (0 without)
       docs  (N C,) int32      each position's document (0 without)
       first                   a sequence of N ints: the first key chunk each query
                               chunk sees (the plan's `first`)
       out   (N, BK, G C, DV), lse (N, BK, G C)   written

   Query chunk i meets key chunk i through intra and each earlier chunk j (first[i]
   <= j < i) through its queries carried to chunk j's end, x_{i-1} = qhat[i], x_{j-1}
   = x_j - x_j hmat[j] (one (D, D) product per step, from the nearest back, as the
   torch loop): score = x_j . khat[j]. Then the mask of _mask: keys after the query
   in the diagonal chunk and keys of another document weigh 0; with a gate the score
   loses gate[j, key] - gate[i, the chunk's last query] (the query's own c_i leaves
   its softmax unchanged). Online softmax over the chunks (attend.c's), exp512's
   cut-off below -87. lse is each query's log of the sum of exp(scores); every
   query sees at least its own key.

   path_core_backward(qhat, khat, v, hmat, hmat_t, intra, gate, docs, first, out, lse,
                      dout, dq, dk, dv, dh, dintra, dgate, sizes, threads) -> bool

   Its gradients, as _PaTHCore.backward: per unit the weights P = exp(score - lse)
   recomputed, dS = P (dO V^T - delta) (delta = rowsum(dout out), made here), dV +=
   P^T dO, dintra = the diagonal chunk's dS, dgate[j, key] -= the key's column sum of
   dS, and for the earlier chunks dK_j += dS_j^T x_j, then the chain run back: with
   g_{first} = dS_first K_first and g_j = dS_j K_j + g_{j-1} (I - hmat[j])^T, dH_j =
   -x_j^T g_{j-1} and dq = g_{i-1}. hmat_t is hmat transposed per chunk (N, BK, D, D),
   C-contiguous; dout as out. dq, dk, dv, dh and dgate (0 without a gate) are
   written whole and must be zeroed by the caller; dintra is written whole. dq and
   dintra are each unit's own; dk, dv, dh and dgate gather from every query chunk,
   so each thread adds into buffers of its own (thread 0 into the outputs), summed
   after: equal to float32 rounding from run to run, not bit for bit.

   Both return False (doing nothing) where they have no loop: without AVX-512, or
   D or DV not a multiple of 16. Units (kv head pair, query chunk, query head of the
   group, block of ABQ queries) go to the threads latest chunk first (the longest
   first). Memory beyond the outputs, per thread: the unit's carried queries and
   dS_j K_j per earlier chunk ((N - 1) ABQ D floats each, backward), and the
   backward's dk, dv, dh and dgate per thread but the first. */

#include "common.h"

typedef struct {
    team_job_t job; /* first: posenc_launch numbers the copies */
    const float *q, *k, *v, *h, *ht, *intra, *gate, *out, *dout;
    const int32_t *docs;
    const Py_ssize_t *first;
    float *lse;
    float *o;                            /* out (forward) */
    float *dq, *dintra;                  /* the units' own */
    float *dk, *dv, *dh, *dgate;         /* this thread's sums (backward) */
    float **dks, **dvs, **dhs, **dgates; /* every thread's, for the sum */
    Py_ssize_t N, BK, G, C, D, DV, nsub, units;
    Py_ssize_t *next; /* the next unit to take, shared */
} path_t;

#if defined(__GNUC__) && defined(__x86_64__)
#define HAVE_AVX512_PATH 1
#include "tiles.h"

/* A unit's place: query chunk i (latest first), kv pair bk, head r of the group, the
   queries t0 .. t0 + nq - 1 of the chunk. */
typedef struct {
    Py_ssize_t i, bk, r, t0, nq, nv, row; /* row: the first query's row of the G C rows */
} place_t;

static place_t place_of(const path_t *a, Py_ssize_t u) {
    place_t p;
    Py_ssize_t per = a->BK * a->G * a->nsub, rest = u % per;
    p.i = a->N - 1 - u / per;
    p.bk = rest / (a->G * a->nsub);
    p.r = rest / a->nsub % a->G;
    p.t0 = rest % a->nsub * ABQ;
    p.nq = a->C - p.t0 < ABQ ? a->C - p.t0 : ABQ;
    p.nv = (p.nq + 15) / 16;
    p.row = p.r * a->C + p.t0;
    return p;
}

/* The unit's scores against key chunk j, in St (C keys x ABQ query lanes) as raw
   products, made into what softmax sees: less the gate's key term, -inf where
   masked (a lane past nq, a key after the query in the diagonal chunk, another
   document). Forward and backward both score through here. */
AVX512 static void mask_scores(const path_t *a, const place_t *p, Py_ssize_t j, float *St) {
    Py_ssize_t C = a->C;
    __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const float *gj = a->gate ? a->gate + ((j * a->BK + p->bk) * a->G + p->r) * C : NULL;
    float glast = gj ? a->gate[((p->i * a->BK + p->bk) * a->G + p->r) * C + C - 1] : 0.0f;
    const int32_t *qd = a->docs ? a->docs + p->i * C + p->t0 : NULL;
    for (Py_ssize_t kk = 0; kk < C; ++kk) {
        __m512 gk = _mm512_set1_ps(gj ? gj[kk] - glast : 0.0f);
        for (Py_ssize_t c = 0; c < p->nv; ++c) {
            float *sp = St + kk * ABQ + 16 * c;
            __mmask16 keep = (__mmask16)(p->nq - 16 * c >= 16 ? 0xffff : (1u << (p->nq - 16 * c)) - 1);
            __m512 s = _mm512_load_ps(sp);
            if (gj) s = _mm512_sub_ps(s, gk);
            if (qd)
                keep = _mm512_mask_cmpeq_epi32_mask(keep, _mm512_maskz_loadu_epi32(keep, qd + 16 * c),
                                                    _mm512_set1_epi32(a->docs[j * C + kk]));
            if (j == p->i) /* causal: query t0 + 16 c + lane sees keys kk <= it */
                keep &= _mm512_cmp_epi32_mask(
                    _mm512_add_epi32(lane, _mm512_set1_epi32((int)(p->t0 + 16 * c))),
                    _mm512_set1_epi32((int)kk), _MM_CMPINT_NLT);
            _mm512_store_ps(sp, _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), keep, s));
        }
    }
}

/* x <- x - x M for the unit's nq carried queries: X rows (ABQ x D), Xt their
   transpose (kept in step), M (D, D) row-major; Y scratch (ABQ x D). */
AVX512 static void carry(const path_t *a, const place_t *p, const float *M, float *X, float *Xt,
                         float *Y, const float **rows) {
    Py_ssize_t D = a->D;
    for (Py_ssize_t e = 0; e < D; ++e) rows[e] = M + e * D;
    memset(Y, 0, sizeof(float) * (size_t)(p->nq * D));
    acc_block(Xt, 0, D, rows, p->nq, Y, D, D);
    for (Py_ssize_t e = 0; e < p->nq * D; e += 16)
        _mm512_storeu_ps(X + e, _mm512_sub_ps(_mm512_loadu_ps(X + e), _mm512_loadu_ps(Y + e)));
    transpose_block(X, D, p->nq, D, Xt);
}

/* The diagonal chunk's scores of the unit, transposed into St (C x ABQ). */
static void intra_scores(const path_t *a, const place_t *p, float *St) {
    const float *src = a->intra + ((p->i * a->BK + p->bk) * a->G * a->C + p->row) * a->C;
    transpose_block(src, a->C, p->nq, a->C, St);
}

typedef struct {
    float *X, *Xt, *Y, *St, *O, *m, *l, *alpha;
    const float **rows;
} fwd_buf_t;

AVX512 static void path_unit(const path_t *a, const place_t *p, const fwd_buf_t *t) {
    Py_ssize_t C = a->C, D = a->D, DV = a->DV, GC = a->G * C, nq = p->nq, nv = p->nv;
    Py_ssize_t base = (p->i * a->BK + p->bk) * GC + p->row;
    memcpy(t->X, a->q + base * D, sizeof(float) * (size_t)(nq * D));
    transpose_block(t->X, D, nq, D, t->Xt);
    for (Py_ssize_t ii = 0; ii < ABQ; ++ii) {
        t->m[ii] = -INFINITY;
        t->l[ii] = 0.0f;
    }
    memset(t->O, 0, sizeof(float) * (size_t)(ABQ * DV));
    __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (Py_ssize_t j = p->i; j >= a->first[p->i]; --j) {
        if (j == p->i)
            intra_scores(a, p, t->St);
        else {
            if (j < p->i - 1) carry(a, p, a->h + ((j + 1) * a->BK + p->bk) * D * D, t->X, t->Xt, t->Y, t->rows);
            scores_block(a->k + (j * a->BK + p->bk) * C * D, D, C, t->Xt, D, nv, t->St);
        }
        mask_scores(a, p, j, t->St);
        __m512 cmax[4] = {ninf, ninf, ninf, ninf}, msafe[4], lsum[4];
        for (Py_ssize_t kk = 0; kk < C; ++kk)
            for (Py_ssize_t c = 0; c < nv; ++c)
                cmax[c] = _mm512_max_ps(cmax[c], _mm512_load_ps(t->St + kk * ABQ + 16 * c));
        for (Py_ssize_t c = 0; c < nv; ++c) {
            __m512 mold = _mm512_load_ps(t->m + 16 * c), mnew = _mm512_max_ps(mold, cmax[c]);
            __mmask16 finite = _mm512_cmp_ps_mask(mnew, ninf, _CMP_NEQ_OQ);
            msafe[c] = _mm512_maskz_mov_ps(finite, mnew);
            _mm512_store_ps(t->alpha + 16 * c, exp512(_mm512_sub_ps(mold, msafe[c])));
            _mm512_store_ps(t->m + 16 * c, mnew);
            lsum[c] = _mm512_setzero_ps();
        }
        for (Py_ssize_t kk = 0; kk < C; ++kk)
            for (Py_ssize_t c = 0; c < nv; ++c) {
                float *sp = t->St + kk * ABQ + 16 * c;
                __m512 e = exp512(_mm512_sub_ps(_mm512_load_ps(sp), msafe[c]));
                _mm512_store_ps(sp, e);
                lsum[c] = _mm512_add_ps(lsum[c], e);
            }
        for (Py_ssize_t c = 0; c < nv; ++c) {
            __m512 al = _mm512_load_ps(t->alpha + 16 * c);
            _mm512_store_ps(t->l + 16 * c, _mm512_fmadd_ps(_mm512_load_ps(t->l + 16 * c), al, lsum[c]));
        }
        for (Py_ssize_t ii = 0; ii < nq; ++ii)
            if (t->alpha[ii] != 1.0f) {
                __m512 al = _mm512_set1_ps(t->alpha[ii]);
                for (Py_ssize_t c = 0; c < DV; c += 16)
                    _mm512_storeu_ps(t->O + ii * DV + c, _mm512_mul_ps(_mm512_loadu_ps(t->O + ii * DV + c), al));
            }
        const float *vb = a->v + (j * a->BK + p->bk) * C * DV;
        for (Py_ssize_t kk = 0; kk < C; ++kk) t->rows[kk] = vb + kk * DV;
        acc_block(t->St, 0, C, t->rows, nq, t->O, DV, DV);
    }
    for (Py_ssize_t ii = 0; ii < nq; ++ii) {
        /* l is 0 only for a query that sees no key (none here: each sees its own) */
        int none = t->l[ii] == 0.0f;
        __m512 iv = _mm512_set1_ps(none ? 0.0f : 1.0f / t->l[ii]);
        for (Py_ssize_t c = 0; c < DV; c += 16)
            _mm512_storeu_ps(a->o + (base + ii) * DV + c, _mm512_mul_ps(_mm512_loadu_ps(t->O + ii * DV + c), iv));
        a->lse[base + ii] = none ? -INFINITY : t->m[ii] + logf(t->l[ii]);
    }
}

/* Scratch of one thread: X, Xt, Y (ABQ x D each), St (C x ABQ), O (ABQ x DV), three
   of ABQ, and the row pointers (max(C, D)). */
static char *fwd_buffers(const path_t *a, fwd_buf_t *t) {
    size_t D = (size_t)a->D, C = (size_t)a->C, DV = (size_t)a->DV, nr = C > D ? C : D;
    size_t floats = 3 * ABQ * D + C * ABQ + ABQ * DV + 3 * ABQ;
    char *buf = NULL;
    if (posix_memalign((void **)&buf, 64, sizeof(float) * floats + sizeof(float *) * nr)) return NULL;
    t->X = (float *)buf;
    t->Xt = t->X + ABQ * D;
    t->Y = t->Xt + ABQ * D;
    t->St = t->Y + ABQ * D;
    t->O = t->St + C * ABQ;
    t->m = t->O + ABQ * DV;
    t->l = t->m + ABQ;
    t->alpha = t->l + ABQ;
    t->rows = (const float **)(t->alpha + ABQ);
    return buf;
}

static void *path_run(void *arg) {
    path_t *a = (path_t *)arg;
    fwd_buf_t t;
    char *buf = fwd_buffers(a, &t);
    if (buf == NULL) {
        a->job.failed = 1;
        return NULL;
    }
    unsigned int csr = flush_to_zero();
    for (;;) {
        Py_ssize_t u = __atomic_fetch_add(a->next, 1, __ATOMIC_RELAXED);
        if (u >= a->units) break;
        place_t p = place_of(a, u);
        path_unit(a, &p, &t);
    }
    _mm_setcsr(csr);
    free(buf);
    return NULL;
}

typedef struct {
    fwd_buf_t f;                     /* X, Xt, Y, St (P), rows */
    float *dOt, *dSt, *G, *Gt, *lse, *delta;
    float *states, *cs;              /* per earlier chunk: x_j and dS_j K_j (ABQ x D) */
    const float **rows2;             /* ABQ rows */
} bwd_buf_t;

AVX512 static void path_backward_unit(const path_t *a, const place_t *p, const bwd_buf_t *t) {
    Py_ssize_t C = a->C, D = a->D, DV = a->DV, GC = a->G * C, nq = p->nq, nv = p->nv;
    Py_ssize_t BK = a->BK, base = (p->i * BK + p->bk) * GC + p->row, j0 = a->first[p->i];
    float *X = t->f.X, *Xt = t->f.Xt, *St = t->f.St;
    const float *ob = a->out + base * DV, *gb = a->dout + base * DV;
    memcpy(X, a->q + base * D, sizeof(float) * (size_t)(nq * D));
    transpose_block(X, D, nq, D, Xt);
    transpose_block(gb, DV, nq, DV, t->dOt);
    for (Py_ssize_t ii = 0; ii < ABQ; ++ii) {
        float s = 0.0f, l = ii < nq ? a->lse[base + ii] : 0.0f;
        for (Py_ssize_t c = 0; ii < nq && c < DV; ++c) s += gb[ii * DV + c] * ob[ii * DV + c];
        /* a query that sees no key: any finite stand-in weighs its scores 0 */
        t->lse[ii] = l != -INFINITY ? l : 0.0f;
        t->delta[ii] = s;
    }
    for (Py_ssize_t ii = 0; ii < nq; ++ii) t->rows2[ii] = gb + ii * DV;
    for (Py_ssize_t j = p->i; j >= j0; --j) {
        float *xs = t->states + (j - j0) * ABQ * D, *cj = t->cs + (j - j0) * ABQ * D;
        if (j == p->i)
            intra_scores(a, p, St);
        else {
            if (j < p->i - 1) carry(a, p, a->h + ((j + 1) * BK + p->bk) * D * D, X, Xt, t->f.Y, t->f.rows);
            memcpy(xs, X, sizeof(float) * (size_t)(nq * D));
            scores_block(a->k + (j * BK + p->bk) * C * D, D, C, Xt, D, nv, St);
        }
        mask_scores(a, p, j, St);
        const float *vb = a->v + (j * BK + p->bk) * C * DV;
        scores_block(vb, DV, C, t->dOt, DV, nv, t->dSt);
        float *dgj = a->dgate ? a->dgate + ((j * BK + p->bk) * a->G + p->r) * C : NULL;
        for (Py_ssize_t kk = 0; kk < C; ++kk) {
            __m512 csum = _mm512_setzero_ps();
            for (Py_ssize_t c = 0; c < nv; ++c) {
                float *sp = St + kk * ABQ + 16 * c, *dp = t->dSt + kk * ABQ + 16 * c;
                __m512 pr = exp512(_mm512_sub_ps(_mm512_load_ps(sp), _mm512_load_ps(t->lse + 16 * c)));
                __m512 ds = _mm512_mul_ps(pr, _mm512_sub_ps(_mm512_load_ps(dp), _mm512_load_ps(t->delta + 16 * c)));
                _mm512_store_ps(sp, pr);
                _mm512_store_ps(dp, ds);
                csum = _mm512_add_ps(csum, ds); /* masked lanes weigh 0: their dS is 0 */
            }
            /* the keys' side -c_j only (the rows' +c_i has gradient 0, see _mask) */
            if (dgj) dgj[kk] -= _mm512_reduce_add_ps(csum);
        }
        /* dV_j += P^T dO */
        acc_block(St, 1, nq, t->rows2, C, a->dv + (j * BK + p->bk) * C * DV, DV, DV);
        if (j == p->i) {
            float *di = a->dintra + base * C;
            for (Py_ssize_t ii = 0; ii < nq; ++ii)
                for (Py_ssize_t kk = 0; kk < C; ++kk) di[ii * C + kk] = t->dSt[kk * ABQ + ii];
            continue;
        }
        /* dK_j += dS_j^T x_j; dS_j K_j for the chain */
        for (Py_ssize_t ii = 0; ii < nq; ++ii) t->f.rows[ii] = xs + ii * D;
        acc_block(t->dSt, 1, nq, t->f.rows, C, a->dk + (j * BK + p->bk) * C * D, D, D);
        const float *kb = a->k + (j * BK + p->bk) * C * D;
        for (Py_ssize_t kk = 0; kk < C; ++kk) t->f.rows[kk] = kb + kk * D;
        memset(cj, 0, sizeof(float) * (size_t)(nq * D));
        acc_block(t->dSt, 0, C, t->f.rows, nq, cj, D, D);
    }
    if (p->i == j0) return; /* dq is 0: the caller's zeros */
    /* the chain run back: g_j = dS_j K_j + g_{j-1} (I - H_j)^T, dH_j = -x_j^T g_{j-1} */
    float *G = t->G;
    memcpy(G, t->cs, sizeof(float) * (size_t)(nq * D));
    for (Py_ssize_t ii = 0; ii < nq; ++ii) t->rows2[ii] = G + ii * D;
    for (Py_ssize_t j = j0 + 1; j < p->i; ++j) {
        const float *xs = t->states + (j - j0) * ABQ * D, *cj = t->cs + (j - j0) * ABQ * D;
        /* this thread's dh holds +x^T g: the sum negates it */
        transpose_block(xs, D, nq, D, Xt);
        acc_block(Xt, 1, nq, t->rows2, D, a->dh + (j * BK + p->bk) * D * D, D, D);
        transpose_block(G, D, nq, D, t->Gt);
        const float *hj = a->ht + (j * BK + p->bk) * D * D;
        for (Py_ssize_t e = 0; e < D; ++e) t->f.rows[e] = hj + e * D;
        memset(t->f.Y, 0, sizeof(float) * (size_t)(nq * D));
        acc_block(t->Gt, 0, D, t->f.rows, nq, t->f.Y, D, D);
        for (Py_ssize_t e = 0; e < nq * D; e += 16)
            _mm512_storeu_ps(G + e, _mm512_sub_ps(_mm512_add_ps(_mm512_loadu_ps(cj + e), _mm512_loadu_ps(G + e)),
                                                  _mm512_loadu_ps(t->f.Y + e)));
    }
    memcpy(a->dq + base * D, G, sizeof(float) * (size_t)(nq * D));
}

static void *path_backward_run(void *arg) {
    path_t *a = (path_t *)arg;
    int i = a->job.tid;
    a->dk = a->dks[i], a->dv = a->dvs[i], a->dh = a->dhs[i], a->dgate = a->dgates[i];
    size_t D = (size_t)a->D, C = (size_t)a->C, DV = (size_t)a->DV, N = (size_t)a->N;
    size_t more = DV * ABQ + C * ABQ + 2 * ABQ * D + 2 * ABQ + 2 * N * ABQ * D;
    bwd_buf_t t;
    char *fbuf = fwd_buffers(a, &t.f), *buf = NULL;
    if (fbuf == NULL || posix_memalign((void **)&buf, 64, sizeof(float) * more + sizeof(float *) * ABQ)) {
        free(fbuf);
        a->job.failed = 1;
        return NULL;
    }
    t.dOt = (float *)buf;
    t.dSt = t.dOt + DV * ABQ;
    t.G = t.dSt + C * ABQ;
    t.Gt = t.G + ABQ * D;
    t.lse = t.Gt + ABQ * D;
    t.delta = t.lse + ABQ;
    t.states = t.delta + ABQ;
    t.cs = t.states + N * ABQ * D;
    t.rows2 = (const float **)(t.cs + N * ABQ * D);
    unsigned int csr = flush_to_zero();
    for (;;) {
        Py_ssize_t u = __atomic_fetch_add(a->next, 1, __ATOMIC_RELAXED);
        if (u >= a->units) break;
        place_t p = place_of(a, u);
        path_backward_unit(a, &p, &t);
    }
    _mm_setcsr(csr);
    free(buf);
    free(fbuf);
    return NULL;
}

/* dk, dv, dgate = the threads' sums, dh = minus theirs, for this thread's share. */
AVX512 static void *path_backward_sum(void *arg) {
    path_t *a = (path_t *)arg;
    Py_ssize_t N = a->N * a->BK;
    sum_partials(a->dks, N * a->C * a->D, 1.0f, &a->job);
    sum_partials(a->dvs, N * a->C * a->DV, 1.0f, &a->job);
    sum_partials(a->dhs, N * a->D * a->D, -1.0f, &a->job);
    sum_partials(a->dgates, N * a->G * a->C, 1.0f, &a->job);
    return NULL;
}
#endif

/* Reads sizes and first into a (first into a fresh array, freed by the caller). */
static int read_path(path_t *a, PyObject *sizes, PyObject *first, int threads) {
    Py_ssize_t sz[6];
    if (posenc_read_sizes(sizes, sz, 6, "sizes")) return -1;
    a->N = sz[0], a->BK = sz[1], a->G = sz[2], a->C = sz[3], a->D = sz[4], a->DV = sz[5];
    for (int i = 0; i < 6; ++i)
        if (sz[i] < 1 || threads < 1) {
            PyErr_SetString(PyExc_ValueError, "path_core: sizes and threads must be >= 1");
            return -1;
        }
    Py_ssize_t *f = (Py_ssize_t *)malloc(sizeof(Py_ssize_t) * (size_t)a->N);
    if (f == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (posenc_read_sizes(first, f, (int)a->N, "first")) {
        free(f);
        return -1;
    }
    for (Py_ssize_t i = 0; i < a->N; ++i)
        if (f[i] < 0 || f[i] > i) {
            free(f);
            PyErr_SetString(PyExc_ValueError, "path_core: first[i] must be in 0 .. i");
            return -1;
        }
    a->first = f;
    a->nsub = (a->C + ABQ - 1) / ABQ;
    a->units = a->N * a->BK * a->G * a->nsub;
    return 0;
}

PyObject *posenc_path_core(PyObject *self, PyObject *args) {
    unsigned long long qp, kp, vp, hp, ip, gp, dp, op, lp;
    PyObject *sizes, *first;
    int threads;
    if (!PyArg_ParseTuple(args, "KKKKKKKOKKOi", &qp, &kp, &vp, &hp, &ip, &gp, &dp, &first, &op,
                          &lp, &sizes, &threads))
        return NULL;
    path_t base;
    memset(&base, 0, sizeof base);
    if (read_path(&base, sizes, first, threads)) return NULL;
#ifdef HAVE_AVX512_PATH
    if (!__builtin_cpu_supports("avx512f") || base.D % 16 || base.DV % 16) {
        free((void *)base.first);
        Py_RETURN_FALSE;
    }
    base.q = (const float *)(uintptr_t)qp;
    base.k = (const float *)(uintptr_t)kp;
    base.v = (const float *)(uintptr_t)vp;
    base.h = (const float *)(uintptr_t)hp;
    base.intra = (const float *)(uintptr_t)ip;
    base.gate = (const float *)(uintptr_t)gp;
    base.docs = (const int32_t *)(uintptr_t)dp;
    base.o = (float *)(uintptr_t)op;
    base.lse = (float *)(uintptr_t)lp;
    if (threads > base.units) threads = (int)base.units;
    Py_ssize_t next = 0;
    base.next = &next;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = posenc_launch(path_run, &base, sizeof base, threads);
    Py_END_ALLOW_THREADS
    free((void *)base.first);
    if (failed) return PyErr_NoMemory();
    Py_RETURN_TRUE;
#else
    (void)qp, (void)kp, (void)vp, (void)hp, (void)ip, (void)gp, (void)dp, (void)op, (void)lp;
    free((void *)base.first);
    Py_RETURN_FALSE;
#endif
}

PyObject *posenc_path_core_backward(PyObject *self, PyObject *args) {
    unsigned long long qp, kp, vp, hp, htp, ip, gp, dp, op, lp, gop, dqp, dkp, dvp, dhp, dip, dgp;
    PyObject *sizes, *first;
    int threads;
    if (!PyArg_ParseTuple(args, "KKKKKKKKOKKKKKKKKKOi", &qp, &kp, &vp, &hp, &htp, &ip, &gp, &dp,
                          &first, &op, &lp, &gop, &dqp, &dkp, &dvp, &dhp, &dip, &dgp, &sizes,
                          &threads))
        return NULL;
    path_t base;
    memset(&base, 0, sizeof base);
    if (read_path(&base, sizes, first, threads)) return NULL;
    if (!gp != !dgp) {
        free((void *)base.first);
        PyErr_SetString(PyExc_ValueError, "path_core_backward: a gate needs its gradient");
        return NULL;
    }
#ifdef HAVE_AVX512_PATH
    if (!__builtin_cpu_supports("avx512f") || base.D % 16 || base.DV % 16) {
        free((void *)base.first);
        Py_RETURN_FALSE;
    }
    base.q = (const float *)(uintptr_t)qp;
    base.k = (const float *)(uintptr_t)kp;
    base.v = (const float *)(uintptr_t)vp;
    base.h = (const float *)(uintptr_t)hp;
    base.ht = (const float *)(uintptr_t)htp;
    base.intra = (const float *)(uintptr_t)ip;
    base.gate = (const float *)(uintptr_t)gp;
    base.docs = (const int32_t *)(uintptr_t)dp;
    base.out = (const float *)(uintptr_t)op;
    base.lse = (float *)(uintptr_t)lp;
    base.dout = (const float *)(uintptr_t)gop;
    base.dq = (float *)(uintptr_t)dqp;
    base.dintra = (float *)(uintptr_t)dip;
    if (threads > base.units) threads = (int)base.units;
    Py_ssize_t next = 0;
    base.next = &next;
    size_t nbk = (size_t)(base.N * base.BK), C = (size_t)base.C, D = (size_t)base.D;
    base.dks = posenc_partials((float *)(uintptr_t)dkp, nbk * C * D, threads);
    base.dvs = posenc_partials((float *)(uintptr_t)dvp, nbk * C * (size_t)base.DV, threads);
    base.dhs = posenc_partials((float *)(uintptr_t)dhp, nbk * D * D, threads);
    base.dgates = posenc_partials((float *)(uintptr_t)dgp, nbk * (size_t)base.G * C, threads);
    int failed = !base.dks || !base.dvs || !base.dhs || !base.dgates;
    if (!failed) {
        Py_BEGIN_ALLOW_THREADS
        failed = posenc_launch(path_backward_run, &base, sizeof base, threads) ||
                 posenc_launch(path_backward_sum, &base, sizeof base, threads);
        Py_END_ALLOW_THREADS
    }
    posenc_partials_free(base.dks, threads);
    posenc_partials_free(base.dvs, threads);
    posenc_partials_free(base.dhs, threads);
    posenc_partials_free(base.dgates, threads);
    free((void *)base.first);
    if (failed) return PyErr_NoMemory();
    Py_RETURN_TRUE;
#else
    (void)qp, (void)kp, (void)vp, (void)hp, (void)htp, (void)ip, (void)gp, (void)dp, (void)op;
    (void)lp, (void)gop, (void)dqp, (void)dkp, (void)dvp, (void)dhp, (void)dip, (void)dgp;
    free((void *)base.first);
    Py_RETURN_FALSE;
#endif
}
