/* Streaming GEMMs for deinsum's local kernels (float64, x86-64 with AVX-512; loaded through ctypes).
 *
 * A GEMM with one narrow side (at most 32 columns of the result, or 32 rows) reads its wide operand
 * once. BLAS libraries first copy ("pack") that operand into a buffer, then compute: the read and
 * the arithmetic do not overlap. These kernels read the wide operand in place, one register tile at a
 * time, and prefetch the memory a coming tile reads while the current one computes, so the read
 * hides behind the arithmetic (order-3 MTTKRP, 256^3, R = 24, mode 1: 13 ms instead of 19 on MKL).
 *
 * stream_rows: T[b] (M x N) = X[b] (M x K) @ W (K x N), N <= 32: X streamed by rows (unit stride
 *              along K), W small (it stays in cache) with unit stride along N (rows ldw apart).
 * stream_cols: T[b] (M x N) = A (M x K) @ X[b] (K x N), M <= 32: X streamed by rows (unit stride
 *              along N), A given transposed and contiguous (K x M).
 * Batches: X[b] = X + b * sbx, T[b] = T + b * sbt; strides in elements.
 * With weights H (nb x R, R = N for rows, M for cols), the batch is summed instead, each T[b] scaled
 * by H[b] along R: T (M x N) += sum_b H[b] * T[b] (MTTKRP's Hadamard-sum over the batch modes).
 * Both return 0; 1 where they could not allocate a weighted sum's scratch blocks (T incomplete then);
 * 2 for a shape they do not take (T untouched then): stream_rows an N outside 1..32, stream_cols an
 * empty M or N.
 * stream_rows_sum: T[f] (1 x N) += sum_g H[g] * (X[f] @ W)[g], N <= 32: as stream_rows, each register
 *              tile's rows weighted by H's and summed as the tile ends (MTTKRP to leading free modes: T
 *              = X times W never stored; order 5, 24^5, R = 24, mode 0: 7.3 ms CPU time instead of 8.4).
 *
 * ttm_chain: a TTM chain (X times one narrow matrix per contracted mode) slab by slab of X, every step
 *            of a slab on these tiles while its intermediates stay in cache: X is read once, and the
 *            later steps never go to memory (TTMc, 24^5, ranks 8: 4.3 ms; BLAS step by step 7.0).
 *
 * Threads (OpenMP, stream_set_threads; 1 by default: no thread team): batches, or one batch's rows or
 * column tiles, or slabs, split among them; a weighted sum adds each thread's own copy of T at the end
 * (TTMc above on 2 threads: 2.9 ms).
 */
#include <stdlib.h>
#include <string.h>

/* The interface version kernels.py checks (an older build left in place is not used). */
int stream_abi(void) { return 5; }

/* Threads the kernels run on (OpenMP, where built with it): the rank's BLAS threads, set by the runtime.
 * With 1, the default, no thread team is made. */
static int n_threads = 1;
void stream_set_threads(long n) { n_threads = n < 1 ? 1 : n > 1024 ? 1024 : (int)n; }

/* GCC only: clang's build of these loops measured 3x slower, no faster than BLAS. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>

#define TARGET __attribute__((target("avx512f,fma")))
#define INLINE static inline __attribute__((always_inline))
/* Loops over a tile's rows and vectors unrolled early, so that GCC keeps the accumulators in registers
 * (without it, the tiles of most shapes kept them on the stack: 2-3x slower). */
#define UNROLL _Pragma("GCC unroll 8")

typedef double v8 __attribute__((vector_size(64), aligned(8)));

/* The lanes of the last vector of a row of n >= 1 elements that exist (n % 8 of them, all 8 when none). */
INLINE __mmask8 tail_mask(long n) { return (__mmask8)(0xFF >> (-n & 7)); }

/* Whether this CPU runs the kernels (AVX-512F): the caller falls back to BLAS otherwise. */
int stream_supported(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
}

/* acc (JB rows, NV vectors) += JB rows of X times W (NV vectors wide) over k in [0, kc), the last vector
 * masked by ``last``; prefetches the rows after them (the next tile's). */
TARGET INLINE void rows_acc(const int JB, const int NV, long kc, const double *x, long ldx, const double *w,
                            long ldw, v8 acc[8][4], __mmask8 last)
{
    const double *next = x + JB * ldx;            /* the rows the next tile reads */
    for (long k = 0; k < kc; ++k) {
        if ((k & 7) == 0)
            UNROLL for (int r = 0; r < JB; ++r)
                __builtin_prefetch(next + r * ldx + k, 0, 3);
        v8 wv[4];
        UNROLL for (int v = 0; v < NV - 1; ++v)
            wv[v] = *(const v8 *)(w + k * ldw + 8 * v);
        wv[NV - 1] = (v8)_mm512_maskz_loadu_pd(last, w + k * ldw + 8 * (NV - 1));
        UNROLL for (int r = 0; r < JB; ++r) {
            double s = x[r * ldx + k];
            UNROLL for (int v = 0; v < NV; ++v)
                acc[r][v] += s * wv[v];
        }
    }
}

/* JB rows of X times W (NV vectors wide) over k in [0, kc): T tile accumulated (first: overwritten);
 * ``last`` masks the lanes of T's last vector that exist (N % 8 columns: T is never written beyond). */
TARGET INLINE void rows_tile(const int JB, const int NV, long kc, const double *x, long ldx,
                             const double *w, long ldw, double *t, long ldt, int first, __mmask8 last)
{
    v8 acc[8][4];
    UNROLL for (int r = 0; r < JB; ++r)
        UNROLL for (int v = 0; v < NV; ++v)
            acc[r][v] = first ? (v8){0} : v < NV - 1 ? *(const v8 *)(t + r * ldt + 8 * v)
                      : (v8)_mm512_maskz_loadu_pd(last, t + r * ldt + 8 * v);
    rows_acc(JB, NV, kc, x, ldx, w, ldw, acc, last);
    UNROLL for (int r = 0; r < JB; ++r) {
        UNROLL for (int v = 0; v < NV - 1; ++v)
            *(v8 *)(t + r * ldt + 8 * v) = acc[r][v];
        _mm512_mask_storeu_pd(t + r * ldt + 8 * (NV - 1), last, (__m512d)acc[r][NV - 1]);
    }
}

/* red (NV vectors) += sum over JB rows r of H[r] * (X[r] @ W) over all of k < K (H's rows ldh apart, the
 * last vector masked by ``last``). */
TARGET INLINE void rows_sum_tile(const int JB, const int NV, long K, const double *x, long ldx, const double *w,
                                 long ldw, const double *h, long ldh, double *red, __mmask8 last)
{
    v8 acc[8][4];
    UNROLL for (int r = 0; r < JB; ++r)
        UNROLL for (int v = 0; v < NV; ++v)
            acc[r][v] = (v8){0};
    rows_acc(JB, NV, K, x, ldx, w, ldw, acc, last);
    UNROLL for (int v = 0; v < NV; ++v) {
        v8 sum = *(v8 *)(red + 8 * v);
        UNROLL for (int r = 0; r < JB; ++r)
            sum += acc[r][v] * (v < NV - 1 ? *(const v8 *)(h + r * ldh + 8 * v)
                                : (v8)_mm512_maskz_loadu_pd(last, h + r * ldh + 8 * v));
        *(v8 *)(red + 8 * v) = sum;
    }
}

#define ROWS_CASE(JB, NV) (h ? rows_sum_tile(JB, NV, kc, x, ldx, w, ldw, h + m * ldh, ldh, t, last) \
                             : rows_tile(JB, NV, kc, x, ldx, w, ldw, t + m * ldt, ldt, first, last))
#define ROWS_REST(JB) switch (nv) { case 1: ROWS_CASE(JB, 1); break; case 2: ROWS_CASE(JB, 2); break; \
                                    case 3: ROWS_CASE(JB, 3); break; default: ROWS_CASE(JB, 4); break; }

/* T (rows x N) = X @ W over k in [0, kc) as ``rows_tile`` (first: overwritten, else accumulated), tile by
 * tile; with h (rows x N, rows ldh apart), t (one row of N) += sum over the rows r of h[r] * (X @ W)[r]
 * instead, each tile's rows summed as it ends (kc then all of K). */
TARGET static void rows_block(long rows, int nv, long kc, const double *x, long ldx, const double *w,
                              long ldw, double *t, long ldt, int first, __mmask8 last, const double *h, long ldh)
{
    const int jb = nv == 4 ? 6 : 8;               /* at most 24 accumulators: no register spills */
    long m = 0;
    for (; m + jb <= rows; m += jb, x += jb * ldx) {
        switch (nv) {
        case 1: ROWS_CASE(8, 1); break;
        case 2: ROWS_CASE(8, 2); break;
        case 3: ROWS_CASE(8, 3); break;
        default: ROWS_CASE(6, 4); break;
        }
    }
    switch (rows - m) {                           /* the last rows, in one tile of their own height */
    case 0: break;
    case 1: ROWS_REST(1); break;
    case 2: ROWS_REST(2); break;
    case 3: ROWS_REST(3); break;
    case 4: ROWS_REST(4); break;
    case 5: ROWS_REST(5); break;
    case 6: ROWS_REST(6); break;
    default: ROWS_REST(7); break;
    }
}

/* K in chunks whose slice of W stays in L2 (32 KiB .. 128 KiB): every X row read once in all. */
#define KC 512

/* T (M x N, rows ldt apart) += one thread's own sum (M x N), one thread at a time. */
static void add_sum(long M, long N, const double *sum, double *T, long ldt)
{
#pragma omp critical
    for (long m = 0; m < M; ++m)
        for (long n = 0; n < N; ++n)
            T[m * ldt + n] += sum[m * N + n];
}

TARGET int stream_rows(long nb, long M, long N, long K, const double *X, long ldx, long sbx,
                       const double *W, long ldw, double *T, long ldt, long sbt, const double *H)
{
    if (N < 1 || N > 32)
        return 2;
    const int nv = (int)((N + 7) / 8);
    const __mmask8 last = tail_mask(N);
    /* work units: batches; one batch in chunks of rows, one per thread; weighted: batches, each thread
     * summing its own copy of T (scratch: one weighted batch, then that copy) */
    const long rc = H || nb >= n_threads ? M : (M + n_threads - 1) / n_threads, chunks = (M + rc - 1) / rc;
    int status = 0;
#pragma omp parallel num_threads(n_threads) if (n_threads > 1)
    {
        double *scratch = H ? malloc(sizeof(double) * (2 * M * N + 1)) : 0, *sum = scratch ? scratch + M * N : 0;
        if (H && !scratch) {
#pragma omp atomic write
            status = 1;
        } else if (H)
            memset(sum, 0, sizeof(double) * M * N);
#pragma omp for schedule(static)
        for (long u = 0; u < nb * chunks; ++u) {
            if (H && !scratch)
                continue;
            const long b = u / chunks, m0 = (u % chunks) * rc, rows = M - m0 < rc ? M - m0 : rc;
            const double *xb = X + b * sbx + m0 * ldx;
            double *tb = H ? scratch : T + b * sbt + m0 * ldt;
            const long ldb = H ? N : ldt;
            for (long k0 = 0; k0 < K; k0 += KC) {
                const long kc = K - k0 < KC ? K - k0 : KC;
                rows_block(rows, nv, kc, xb + k0, ldx, W + k0 * ldw, ldw, tb, ldb, k0 == 0, last, 0, 0);
            }
            if (H)
                for (long m = 0; m < M; ++m)
                    for (long n = 0; n < N; ++n)
                        sum[m * N + n] += H[b * N + n] * scratch[m * N + n];
        }
        if (H && scratch)
            add_sum(M, N, sum, T, ldt);
        free(scratch);
    }
    return status;
}

/* T[f] (row f of T, N <= 32 columns) += sum over g < G of H[g] * (X[f] @ W)[g]: X[f] = X + f * sbx (G x K,
 * rows ldx apart), W (K x N, rows ldw apart) and H (G x N, rows ldh apart) shared. MTTKRP to leading free
 * modes f: the GEMM over trailing modes and the Hadamard-sum over the modes between in one pass, each
 * tile's rows summed in registers (T = X times W never stored; W and H stay in L2). Work units: batches,
 * or, with fewer batches than threads, each batch's rows in chunks (their sums added atomically). Returns
 * 0; 2 for an N outside 1..32 (T untouched then). */
TARGET int stream_rows_sum(long nf, long G, long N, long K, const double *X, long ldx, long sbx, const double *W,
                           long ldw, const double *H, long ldh, double *T, long ldt)
{
    if (N < 1 || N > 32)
        return 2;
    const int nv = (int)((N + 7) / 8);
    const __mmask8 last = tail_mask(N);
    const long split = nf >= n_threads ? 1 : (n_threads + nf - 1) / nf;
    const long gc = ((G + split - 1) / split + 7) / 8 * 8;
#pragma omp parallel for schedule(static) num_threads(n_threads) if (n_threads > 1)
    for (long u = 0; u < nf * split; ++u) {
        const long f = u / split, g0 = (u % split) * gc, rows = G - g0 < gc ? G - g0 : gc;
        if (rows <= 0)
            continue;
        double red[32] __attribute__((aligned(64))) = {0};
        rows_block(rows, nv, K, X + f * sbx + g0 * ldx, ldx, W, ldw, red, 0, 1, last, H + g0 * ldh, ldh);
        for (long n = 0; n < N; ++n)
#pragma omp atomic
            T[f * ldt + n] += red[n];
    }
    return 0;
}

/* MR rows of A (given as K x lda, transposed) times NV vectors of X over all K into T, the last vector
 * masked by ``last`` (the columns that exist: N % 8, T never written beyond); with ``next``, prefetches
 * that tile's rows. */
TARGET INLINE void cols_tile(const int MR, const int NV, long K, const double *at, long lda,
                             const double *x, long ldx, double *t, long ldt, const double *next, __mmask8 last)
{
    v8 acc[8][3];
    UNROLL for (int r = 0; r < MR; ++r)
        UNROLL for (int v = 0; v < NV; ++v)
            acc[r][v] = (v8){0};
    for (long k = 0; k < K; ++k) {
        const double *xp = x + k * ldx;
        if (next)
            UNROLL for (int v = 0; v < NV; ++v)
                __builtin_prefetch(next + k * ldx + 8 * v, 0, 3);
        v8 xv[3];
        UNROLL for (int v = 0; v < NV - 1; ++v)
            xv[v] = *(const v8 *)(xp + 8 * v);
        xv[NV - 1] = (v8)_mm512_maskz_loadu_pd(last, xp + 8 * (NV - 1));
        const double *a = at + k * lda;
        UNROLL for (int r = 0; r < MR; ++r) {
            double s = a[r];
            UNROLL for (int v = 0; v < NV; ++v)
                acc[r][v] += s * xv[v];
        }
    }
    UNROLL for (int r = 0; r < MR; ++r) {
        UNROLL for (int v = 0; v < NV - 1; ++v)
            *(v8 *)(t + r * ldt + 8 * v) = acc[r][v];
        _mm512_mask_storeu_pd(t + r * ldt + 8 * (NV - 1), last, (__m512d)acc[r][NV - 1]);
    }
}

/* t (rows x n, rows ldt apart) += h * tile (rows x n, rows 24 apart), h scaling the rows. */
TARGET static void add_cols(long rows, long n, const double *tile, const double *h, double *t, long ldt)
{
    for (long r = 0; r < rows; ++r)
        for (long c = 0; c < n; ++c)
            t[r * ldt + c] += h[r] * tile[r * 24 + c];
}

#define COLS_FN(MR, NV) \
TARGET __attribute__((noinline)) static void cols_plain_##MR##_##NV(long K, const double *at, long lda, \
    const double *x, long ldx, double *t, long ldt, const double *next, __mmask8 last) \
{ cols_tile(MR, NV, K, at, lda, x, ldx, t, ldt, next, last); } \
TARGET static void cols_##MR##_##NV(long K, const double *at, long lda, const double *x, long ldx, \
    double *t, long ldt, const double *next, __mmask8 last, long n, const double *h) \
{ \
    double tile[8 * 24]; \
    if (!h) { cols_plain_##MR##_##NV(K, at, lda, x, ldx, t, ldt, next, last); return; } \
    cols_plain_##MR##_##NV(K, at, lda, x, ldx, tile, 24, next, last); \
    add_cols(MR, n, tile, h, t, ldt); \
}
#define COLS_FNS(MR) COLS_FN(MR, 1) COLS_FN(MR, 2) COLS_FN(MR, 3)
COLS_FNS(1) COLS_FNS(2) COLS_FNS(3) COLS_FNS(4) COLS_FNS(5) COLS_FNS(6) COLS_FNS(7) COLS_FNS(8)
#define COLS_TILE(MR, NV) cols_##MR##_##NV(K, at + m, lda, xp, ldx, tp, ldt, next, last, n, hm)
#define COLS_MR(NV) switch (mr) { \
    case 8: COLS_TILE(8, NV); break; case 7: COLS_TILE(7, NV); break; \
    case 6: COLS_TILE(6, NV); break; case 5: COLS_TILE(5, NV); break; \
    case 4: COLS_TILE(4, NV); break; case 3: COLS_TILE(3, NV); break; \
    case 2: COLS_TILE(2, NV); break; default: COLS_TILE(1, NV); break; }

/* T (M x N, rows ldt apart) = A @ X (K x N, rows ldx apart), A given as at (K x M, rows lda apart); with
 * h, T += h * (A @ X) instead, h scaling T's rows. Column tiles of 24; prefetches two tiles ahead, past
 * the last tile into ``after`` (the next panel's X, rows ldx apart) where given. */
TARGET static void cols_panel(long M, long N, long K, const double *at, long lda, const double *x, long ldx,
                              double *t, long ldt, const double *h, const double *after)
{
    const long tiles = (N + 23) / 24;
    for (long q = 0; q < tiles; ++q) {
        const long c = 24 * q, n = N - c < 24 ? N - c : 24;
        const int nv = (int)((n + 7) / 8);
        const __mmask8 last = tail_mask(n);
        const double *ahead = q + 2 < tiles ? x + c + 48 : after ? after + 24 * (q + 2 - tiles) : 0;
        for (long m = 0; m < M; m += 8) {
            const int mr = M - m < 8 ? (int)(M - m) : 8;
            const double *xp = x + c, *next = m == 0 ? ahead : 0, *hm = h ? h + m : 0;
            double *tp = t + m * ldt + c;
            if (nv == 3) { COLS_MR(3) } else if (nv == 2) { COLS_MR(2) } else { COLS_MR(1) }
        }
    }
}

TARGET int stream_cols(long nb, long M, long N, long K, const double *at, const double *X, long ldx,
                       long sbx, double *T, long ldt, long sbt, const double *H)
{
    if (M < 1 || N < 1)
        return 2;
    /* work units: batches; one batch in chunks of columns (whole tiles), one per thread; weighted: batches,
     * each thread summing its own copy of T */
    const long tiles = (N + 23) / 24, per = H || nb >= n_threads ? tiles : (tiles + n_threads - 1) / n_threads;
    const long cc = 24 * per, chunks = (N + cc - 1) / cc;
    int status = 0;
#pragma omp parallel num_threads(n_threads) if (n_threads > 1)
    {
        double *sum = H ? calloc(M * N + 1, sizeof(double)) : 0;
        if (H && !sum) {
#pragma omp atomic write
            status = 1;
        }
#pragma omp for schedule(static)
        for (long u = 0; u < nb * chunks; ++u) {
            if (H && !sum)
                continue;
            const long b = u / chunks, c0 = (u % chunks) * cc, n = N - c0 < cc ? N - c0 : cc;
            const double *xb = X + b * sbx + c0;
            const double *after = c0 + n < N ? xb + n : b + 1 < nb ? X + (b + 1) * sbx : 0;
            if (H)
                cols_panel(M, n, K, at, M, xb, ldx, sum + c0, N, H + b * M, after);
            else
                cols_panel(M, n, K, at, M, xb, ldx, T + b * sbt + c0, ldt, 0, after);
        }
        if (H && sum)
            add_sum(M, N, sum, T, ldt);
        free(sum);
    }
    return status;
}

/* One mode product: T (A x n x B) -> Y (A x w x B), Y[a] = U^T @ T[a] with U (n x w, C order); both
 * tensors C-ordered. B = 1 (the last mode): Y = T @ U, in column chunks of at most 32. */
TARGET static void mode_product(long A, long n, long B, long w, const double *U, const double *T, double *Y)
{
    if (B == 1) {
        for (long c = 0; c < w; c += 32) {
            const long nc = w - c < 32 ? w - c : 32;
            const int nv = (int)((nc + 7) / 8);
            const __mmask8 last = tail_mask(nc);
            for (long k0 = 0; k0 < n; k0 += KC)
                rows_block(A, nv, n - k0 < KC ? n - k0 : KC, T + k0, n, U + k0 * w + c, w, Y + c, w, k0 == 0,
                           last, 0, 0);
        }
        return;
    }
    for (long a = 0; a < A; ++a)
        cols_panel(w, B, n, U, w, T + a * n * B, B, Y + a * w * B, B, 0, a + 1 < A ? T + (a + 1) * n * B : 0);
}

/* A TTM chain slab by slab: each of ``slabs`` slabs of X (sx elements apart) goes through ``steps`` mode
 * products, step s taking (A, n, B) to (A, w, B) with U[s] (n x w, C order) for dims[4 s ..] = A, n, B, w;
 * the last step writes Y's slab (sy apart). The intermediates of a slab stay in cache; X is read once.
 * Returns 0; 1 where it could not allocate its two intermediates, 2 for an empty dimension or a step
 * whose input is not the previous step's output (Y untouched then). */
TARGET int ttm_chain(long slabs, long steps, const long *dims, const double *const *U, const double *X, long sx,
                     double *Y, long sy)
{
    long big = 0;
    for (long s = 0; s < steps; ++s) {
        const long *d = dims + 4 * s;
        if (d[0] < 1 || d[1] < 1 || d[2] < 1 || d[3] < 1)
            return 2;
        if (s > 0 && d[0] * d[1] * d[2] != dims[4 * s - 4] * dims[4 * s - 1] * dims[4 * s - 2])
            return 2;
        if (s + 1 < steps && d[0] * d[3] * d[2] > big)
            big = d[0] * d[3] * d[2];
    }
    if (steps < 1)
        return 2;
    int status = 0;
#pragma omp parallel num_threads(n_threads) if (n_threads > 1 && slabs > 1)
    {
        double *buf = big ? malloc(sizeof(double) * 2 * big) : 0;
        if (big && !buf) {
#pragma omp atomic write
            status = 1;
        }
#pragma omp for schedule(static)
        for (long slab = 0; slab < slabs; ++slab) {
            if (big && !buf)
                continue;
            const double *src = X + slab * sx;
            for (long s = 0; s < steps; ++s) {
                const long *d = dims + 4 * s;
                double *dst = s + 1 == steps ? Y + slab * sy : buf + (s % 2) * big;
                mode_product(d[0], d[1], d[2], d[3], U[s], src, dst);
                src = dst;
            }
        }
        free(buf);
    }
    return status;
}
#else
int stream_supported(void) { return 0; }
#endif
