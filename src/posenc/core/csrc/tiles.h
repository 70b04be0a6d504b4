/* The AVX-512 pieces the attention loops share (attend.c, breaking.c, ...): an exp
   without subnormals, score tiles of keys against a block of queries transposed
   along the vector lanes, the online softmax's step, weighted sums of rows, the
   documents' binary search, the sum of per-thread copies and flush-to-zero. Included
   inside each file's `#if defined(__GNUC__) && defined(__x86_64__)`: every function is
   static, a copy per file. */

#ifndef POSENC_KERNELS_TILES_H
#define POSENC_KERNELS_TILES_H

#define AVX512 __attribute__((target("avx512f"), unused))

#define ABQ 64 /* queries per block: four vectors of 16 */

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
    AVX512 static inline void s_tile_##R##_##NV(const float *const *kr, const float *Qt,       \
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
__attribute__((unused)) static const s_tile_fn S6[5] = {NULL, s_tile_6_1, s_tile_6_2, s_tile_6_3, s_tile_6_4};
__attribute__((unused)) static const s_tile_fn S1[5] = {NULL, s_tile_1_1, s_tile_1_2, s_tile_1_3, s_tile_1_4};

/* Scores of n rows x_r (row r at x + r * stride) against the transposed block Xt
   (dim vectors of ABQ lanes): St[r][.] = x_r . Xt, in tiles of six rows and one. */
AVX512 static void scores_block(const float *x, Py_ssize_t stride, Py_ssize_t n, const float *Xt,
                                Py_ssize_t dim, Py_ssize_t nv, float *St) {
    const float *rows[6];
    Py_ssize_t r = 0;
    for (; r + 6 <= n; r += 6) {
        for (int t = 0; t < 6; ++t) rows[t] = x + (r + t) * stride;
        S6[nv](rows, Xt, dim, St + r * ABQ);
    }
    for (; r < n; ++r) {
        rows[0] = x + r * stride;
        S1[nv](rows, Xt, dim, St + r * ABQ);
    }
}

/* One block's step of the online softmax for the nq queries (nv vectors) of a block
   against its nk keys: St (a row of ABQ queries per key) holds the block's
   scores and cmax[c] their maximum per query. Each query's running maximum m takes the
   block's in; alpha = exp(m_old - m_new) rescales its sum l and its row of O (DV
   columns; rows whose alpha is 1 are left alone); St becomes the weights exp(score -
   m), and their row sums are added into l. A query whose maximum is still -inf
   subtracts 0 instead, so that its masked scores weigh exactly 0 (not NaN). */
AVX512 static inline void softmax_step(float *St, Py_ssize_t nk, Py_ssize_t nq, Py_ssize_t nv,
                                       const __m512 *cmax, float *m, float *l, float *alpha,
                                       float *O, Py_ssize_t DV) {
    __m512 ninf = _mm512_set1_ps(-INFINITY), msafe[4], lsum[4];
    for (Py_ssize_t c = 0; c < nv; ++c) {
        __m512 mold = _mm512_load_ps(m + 16 * c), mnew = _mm512_max_ps(mold, cmax[c]);
        __mmask16 finite = _mm512_cmp_ps_mask(mnew, ninf, _CMP_NEQ_OQ);
        msafe[c] = _mm512_maskz_mov_ps(finite, mnew);
        _mm512_store_ps(alpha + 16 * c, exp512(_mm512_sub_ps(mold, msafe[c])));
        _mm512_store_ps(m + 16 * c, mnew);
        lsum[c] = _mm512_setzero_ps();
    }
    for (Py_ssize_t jj = 0; jj < nk; ++jj)
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
}

/* Xt[d][ii] = x_ii[d] (row ii at x + ii * stride) for the n <= ABQ rows of a block,
   0 in the lanes past n up to the next multiple of 16 (the tiles read whole vectors
   of queries, and no further): a block of queries (or of their output gradients)
   with the queries along the vector lanes. Short sequences make many small blocks,
   so only the lanes read are written. */
__attribute__((unused)) static void transpose_block(const float *x, Py_ssize_t stride, Py_ssize_t n, Py_ssize_t dim,
                            float *Xt) {
    Py_ssize_t lanes = (n + 15) / 16 * 16;
    for (Py_ssize_t ii = 0; ii < n; ++ii)
        for (Py_ssize_t d = 0; d < dim; ++d) Xt[d * ABQ + ii] = x[ii * stride + d];
    for (Py_ssize_t d = 0; d < dim; ++d)
        for (Py_ssize_t ii = n; ii < lanes; ++ii) Xt[d * ABQ + ii] = 0.0f;
}

/* O[r][c0 ..] += sum_j W[j * SJ + r * SR] X_j[c0 ..] for R output rows and NC vectors
   of columns: a weighted sum of rows X_j, the weights a block's (key, query) matrix
   W (a key's row of ABQ queries). Read per query, (SJ, SR) = (ABQ, 1): out = P V,
   dQ = dS K; read per key, (1, ABQ): dV = P^T dO, dK = dS^T Q. The strides are
   constants so that each weight is one broadcast from a fixed offset. */
#define ACC_TILE(KIND, SJ, SR, R, NC)                                                    \
    AVX512 static void acc_##KIND##_##R##_##NC(const float *W, Py_ssize_t n,              \
                                                 const float *const *xr, Py_ssize_t c0,    \
                                                 float *O, Py_ssize_t ostride) {           \
        __m512 acc[R][NC];                                                               \
        for (int r = 0; r < R; ++r)                                                      \
            for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_loadu_ps(O + r * ostride + c0 + 16 * c); \
        for (Py_ssize_t j = 0; j < n; ++j) {                                             \
            __m512 xv[NC];                                                               \
            for (int c = 0; c < NC; ++c) xv[c] = _mm512_loadu_ps(xr[j] + c0 + 16 * c);   \
            for (int r = 0; r < R; ++r) {                                                \
                __m512 w = _mm512_set1_ps(W[j * (SJ) + r * (SR)]);                       \
                for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_fmadd_ps(w, xv[c], acc[r][c]); \
            }                                                                            \
        }                                                                                \
        for (int r = 0; r < R; ++r)                                                      \
            for (int c = 0; c < NC; ++c) _mm512_storeu_ps(O + r * ostride + c0 + 16 * c, acc[r][c]); \
    }
#define ACC_TILES(KIND, SJ, SR)                                                          \
    ACC_TILE(KIND, SJ, SR, 4, 1) ACC_TILE(KIND, SJ, SR, 4, 2) ACC_TILE(KIND, SJ, SR, 4, 3)  \
    ACC_TILE(KIND, SJ, SR, 4, 4) ACC_TILE(KIND, SJ, SR, 1, 1) ACC_TILE(KIND, SJ, SR, 1, 2)  \
    ACC_TILE(KIND, SJ, SR, 1, 3) ACC_TILE(KIND, SJ, SR, 1, 4)
ACC_TILES(perq, ABQ, 1)
ACC_TILES(perk, 1, ABQ)

typedef void (*acc_tile_fn)(const float *, Py_ssize_t, const float *const *, Py_ssize_t, float *,
                            Py_ssize_t);
/* [per key][rows 4 or 1][column vectors] */
__attribute__((unused)) static const acc_tile_fn ACC[2][2][5] = {
    {{NULL, acc_perq_4_1, acc_perq_4_2, acc_perq_4_3, acc_perq_4_4},
     {NULL, acc_perq_1_1, acc_perq_1_2, acc_perq_1_3, acc_perq_1_4}},
    {{NULL, acc_perk_4_1, acc_perk_4_2, acc_perk_4_3, acc_perk_4_4},
     {NULL, acc_perk_1_1, acc_perk_1_2, acc_perk_1_3, acc_perk_1_4}}};

/* O[r] += sum_j W[j, r] X_j for the nrows rows of O (ostride apart) and their cols
   columns (a multiple of 16), over the n rows xr[j]; W read per key or per query
   (ACC_TILE). */
__attribute__((unused)) static void acc_block(const float *W, int perkey, Py_ssize_t n, const float *const *xr,
                      Py_ssize_t nrows, float *O, Py_ssize_t ostride, Py_ssize_t cols) {
    Py_ssize_t sr = perkey ? ABQ : 1;
    for (Py_ssize_t c0 = 0; c0 < cols; c0 += 64) {
        Py_ssize_t nc = (cols - c0) / 16 < 4 ? (cols - c0) / 16 : 4, r = 0;
        for (; r + 4 <= nrows; r += 4) ACC[perkey][0][nc](W + r * sr, n, xr, c0, O + r * ostride, ostride);
        for (; r < nrows; ++r) ACC[perkey][1][nc](W + r * sr, n, xr, c0, O + r * ostride, ostride);
    }
}

/* The first index of the nondecreasing ids[0 .. n - 1] whose id is >= want (n if none). */
__attribute__((unused)) static Py_ssize_t first_at_least(const int32_t *ids, Py_ssize_t n, int64_t want) {
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (ids[mid] < want) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* each[0][e] = (each[0][e] + each[1][e] + .. + each[nthreads - 1][e]) * factor, added in
   that order, for the elements of job's share of 0 .. n - 1 (whole vectors): the sum of
   a backward's per-thread copies of an output (posenc_partials), run on every thread
   after the loop. Nothing where each[0] is NULL (the output is not wanted). */
AVX512 static void sum_partials(float *const *each, Py_ssize_t n, float factor, const team_job_t *job) {
    if (each[0] == NULL) return;
    Py_ssize_t share = ((n + job->nthreads - 1) / job->nthreads + 15) / 16 * 16;
    Py_ssize_t lo = job->tid * share, hi = lo + share < n ? lo + share : n;
    for (Py_ssize_t e = lo; e < hi; ++e) {
        float s = each[0][e];
        for (int i = 1; i < job->nthreads; ++i) s += each[i][e];
        each[0][e] = s * factor;
    }
}

/* Sets flush-to-zero on this thread (an OpenMP thread of torch's, or the caller's) and
   returns the control word to restore. A product of a weight just above the exp
   cut-off (2**-125) and a value below 1 is subnormal, and so is a sum of such
   products, so every later multiply-add on it takes a microcode assist, two
   orders of magnitude slower: the Forgetting Transformer's gates near 1/2 (their
   initial value) put some 20 keys of every query there and made the forward 2.3x
   slower (measured). Flushed, such a product is 0: below 2**-126 of the row's
   largest weight, it changes nothing in float32. */
__attribute__((unused)) static unsigned int flush_to_zero(void) {
    unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8000); /* FTZ */
    return csr;
}

#endif
