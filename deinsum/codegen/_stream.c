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
 * Both return 0; stream_rows returns 1 where it could not allocate its scratch block and 2 for an N
 * outside 1..32, stream_cols 2 for an empty M or N (T untouched then).
 */
#include <stdlib.h>
#include <string.h>

/* The interface version kernels.py checks (an older build left in place is not used). */
int stream_abi(void) { return 2; }

/* GCC only: clang's build of these loops measured 3x slower, no faster than BLAS. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>

#define TARGET __attribute__((target("avx512f,fma")))
#define INLINE static inline __attribute__((always_inline))
/* Loops over a tile's rows and vectors unrolled early, so that GCC keeps the accumulators in registers
 * (without it, the tiles of most shapes kept them on the stack: 2-3x slower). */
#define UNROLL _Pragma("GCC unroll 8")

typedef double v8 __attribute__((vector_size(64), aligned(8)));

/* Whether this CPU runs the kernels (AVX-512F): the caller falls back to BLAS otherwise. */
int stream_supported(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
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
    UNROLL for (int r = 0; r < JB; ++r) {
        UNROLL for (int v = 0; v < NV - 1; ++v)
            *(v8 *)(t + r * ldt + 8 * v) = acc[r][v];
        _mm512_mask_storeu_pd(t + r * ldt + 8 * (NV - 1), last, (__m512d)acc[r][NV - 1]);
    }
}

#define ROWS_CASE(JB, NV) rows_tile(JB, NV, kc, x, ldx, w, ldw, t, ldt, first, last)
#define ROWS_REST(JB) switch (nv) { case 1: ROWS_CASE(JB, 1); break; case 2: ROWS_CASE(JB, 2); break; \
                                    case 3: ROWS_CASE(JB, 3); break; default: ROWS_CASE(JB, 4); break; }

TARGET static void rows_block(long rows, int nv, long kc, const double *x, long ldx, const double *w,
                              long ldw, double *t, long ldt, int first, __mmask8 last)
{
    const int jb = nv == 4 ? 6 : 8;               /* at most 24 accumulators: no register spills */
    long m = 0;
    for (; m + jb <= rows; m += jb, x += jb * ldx, t += jb * ldt) {
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

TARGET int stream_rows(long nb, long M, long N, long K, const double *X, long ldx, long sbx,
                       const double *W, long ldw, double *T, long ldt, long sbt, const double *H)
{
    if (N < 1 || N > 32)
        return 2;
    const int nv = (int)((N + 7) / 8);
    const __mmask8 last = (__mmask8)(0xFF >> (8 * nv - N));
    double *scratch = H ? malloc(sizeof(double) * (M * N + 1)) : 0;   /* one weighted batch at a time */
    if (H && !scratch)
        return 1;
    for (long b = 0; b < nb; ++b) {
        const double *xb = X + b * sbx;
        double *tb = H ? scratch : T + b * sbt;
        long ldb = H ? N : ldt;
        for (long k0 = 0; k0 < K; k0 += KC) {
            long kc = K - k0 < KC ? K - k0 : KC;
            rows_block(M, nv, kc, xb + k0, ldx, W + k0 * ldw, ldw, tb, ldb, k0 == 0, last);
        }
        if (H)
            for (long m = 0; m < M; ++m)
                for (long n = 0; n < N; ++n)
                    T[m * ldt + n] += H[b * N + n] * scratch[m * N + n];
    }
    free(scratch);
    return 0;
}

/* MR rows of A (given as K x lda, transposed) times NV vectors of X over all K into T; with
 * ``next``, prefetches that tile's rows. */
TARGET INLINE void cols_tile(const int MR, const int NV, long K, const double *at, long lda,
                             const double *x, long ldx, double *t, long ldt, const double *next)
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
        UNROLL for (int v = 0; v < NV; ++v)
            xv[v] = *(const v8 *)(xp + 8 * v);
        const double *a = at + k * lda;
        UNROLL for (int r = 0; r < MR; ++r) {
            double s = a[r];
            UNROLL for (int v = 0; v < NV; ++v)
                acc[r][v] += s * xv[v];
        }
    }
    UNROLL for (int r = 0; r < MR; ++r)
        UNROLL for (int v = 0; v < NV; ++v)
            *(v8 *)(t + r * ldt + 8 * v) = acc[r][v];
}

/* t (rows x n, rows ldt apart) += h * tile (rows x n, rows 24 apart), h scaling the rows. */
TARGET static void add_cols(long rows, long n, const double *tile, const double *h, double *t, long ldt)
{
    for (long r = 0; r < rows; ++r)
        for (long c = 0; c < n; ++c)
            t[r * ldt + c] += h[r] * tile[r * 24 + c];
}

#define COLS_FN(MR, NV) \
TARGET __attribute__((noinline)) static void cols_plain_##MR##_##NV( \
    long K, const double *at, long lda, const double *x, long ldx, double *t, long ldt, const double *next) \
{ cols_tile(MR, NV, K, at, lda, x, ldx, t, ldt, next); } \
TARGET static void cols_##MR##_##NV( \
    long K, const double *at, long lda, const double *x, long ldx, double *t, long ldt, const double *next, \
    const double *h) \
{ \
    double tile[8 * 24]; \
    if (!h) { cols_plain_##MR##_##NV(K, at, lda, x, ldx, t, ldt, next); return; } \
    cols_plain_##MR##_##NV(K, at, lda, x, ldx, tile, 24, next); \
    add_cols(MR, 8 * NV, tile, h, t, ldt); \
}
#define COLS_FNS(MR) COLS_FN(MR, 1) COLS_FN(MR, 2) COLS_FN(MR, 3)
COLS_FNS(1) COLS_FNS(2) COLS_FNS(3) COLS_FNS(4) COLS_FNS(5) COLS_FNS(6) COLS_FNS(7) COLS_FNS(8)
#define COLS_TILE(MR, NV) cols_##MR##_##NV(K, at + m, M, xp, ldx, tp, ldt, next, hm)
#define COLS_MR(NV) switch (mr) { \
    case 8: COLS_TILE(8, NV); break; case 7: COLS_TILE(7, NV); break; \
    case 6: COLS_TILE(6, NV); break; case 5: COLS_TILE(5, NV); break; \
    case 4: COLS_TILE(4, NV); break; case 3: COLS_TILE(3, NV); break; \
    case 2: COLS_TILE(2, NV); break; default: COLS_TILE(1, NV); break; }

TARGET int stream_cols(long nb, long M, long N, long K, const double *at, const double *X, long ldx,
                       long sbx, double *T, long ldt, long sbt, const double *H)
{
    if (M < 1 || N < 1)
        return 2;
    const long main = N - N % 8, tiles = (main + 23) / 24;      /* column tiles per batch (the last narrower) */
    if (H)
        sbt = 0;
    for (long b = 0; b < nb; ++b) {
        const double *xb = X + b * sbx, *hb = H ? H + b * M : 0;
        double *tb = T + b * sbt;
        for (long q = 0; q < tiles; ++q) {
            const long n = 24 * q;
            const int nv = main - n >= 24 ? 3 : main - n >= 16 ? 2 : 1;
            const long ahead = q + 2 < tiles ? n + 48 : b + 1 < nb ? sbx + 24 * (q + 2 - tiles) : -1;
            for (long m = 0; m < M; m += 8) {
                const int mr = M - m < 8 ? (int)(M - m) : 8;
                const double *xp = xb + n, *next = m == 0 && ahead >= 0 ? xb + ahead : 0, *hm = hb ? hb + m : 0;
                double *tp = tb + m * ldt + n;
                if (nv == 3) { COLS_MR(3) } else if (nv == 2) { COLS_MR(2) } else { COLS_MR(1) }
            }
        }
        for (long n = main; n < N; ++n)              /* the last N % 8 columns, one at a time */
            for (long m = 0; m < M; ++m) {
                double s = 0.0;
                for (long k = 0; k < K; ++k)
                    s += at[k * M + m] * xb[k * ldx + n];
                tb[m * ldt + n] = hb ? tb[m * ldt + n] + hb[m] * s : s;
            }
    }
    return 0;
}
#else
int stream_supported(void) { return 0; }
#endif
