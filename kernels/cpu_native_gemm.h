/* Float32 linear for the small passes of the CPU worker (decodes, short extends, up to ~128 rows):
 *
 *     y [M, N] = x [M, K] W^T (+ bias [N]),   W [N, K] float32
 *
 * with W packed once (radixrt_pack_linear_f32) into column panels of GEMM_NR = 32 outputs,
 * wp [ceil(N / 32)][K][32] (zero past N), so that one K step of a panel is two aligned 64-byte vectors.
 *
 * Per panel (OpenMP threads take contiguous runs of panels), the rows are cut into blocks of at most
 * GEMM_MR = 12 (near-equal sizes); a block keeps its MR x 32 outputs in 2 * MR of the 32 vector
 * registers and, per K step, loads the panel's two vectors once and broadcasts each of its MR x
 * values (x is repacked per block as [K][MR], one pointer for the broadcasts). The panel (K x 128 bytes)
 * is read from memory by the first block and from the core's L2 by the others: W is read from memory
 * once per call, whatever M is. The usual register-blocked outer-product GEMM (the GotoBLAS / BLIS
 * micro-kernel, Goto and van de Geijn 2008), without the K blocking that large GEMMs need: K is at most
 * a few thousand here and a whole panel fits in L2.
 *
 * Software prefetch: the panel GEMM_PF_DIST ahead (the next one) is prefetched into L2 under the
 * current panel's arithmetic, each row block taking an equal share of its 2K lines spread evenly over its K
 * steps (a single block: two lines per step), so the requests go out at an even rate through the
 * whole panel. Without it a panel's first block waits for DRAM: on the 2-vCPU Xeon VM of 2026-12-02
 * the default model's layer at 32 rows ran in ~1.6 ms without, ~1.3 ms with the prefetch issued by
 * the first two blocks only and ~1.2 ms spread over all of them (bench/kernels/cpu_linear_bench.py;
 * oneDNN's packed linear 1.7 ms). The panel one ahead (GEMM_PF_DIST 1) rather than two: on the same
 * kind of VM on 2026-12-03 (36 weight copies, medians of alternated builds) the layer took 5-9% less
 * at 4, 12, 32, 64 and 128 rows (32 rows: 854-906 against 917-947 us); prefetching at twice the
 * rate, or two or four panels ahead, took longer, and no software prefetch at all ~35% longer.
 *
 * SwiGLU (radixrt_linear_silu_f32): a fused [gate; up] weight packed with gate rows in each panel's
 * first 16 columns and the same up rows in its last 16 (radixrt_pack_gate_up_f32) ends each block as
 * silu(gate) * up for 16 output columns, computed in registers; the [M, 2I] output is never stored.
 *
 * AVX-512 only (32 vector registers); elsewhere radixrt_linear_f32_supported() returns 0 and the
 * caller keeps torch's linear.
 */
#include <stdint.h>

#ifdef __AVX512F__
#include <immintrin.h>

#define GEMM_NR 32
#define GEMM_MR 12
#define GEMM_PF_DIST 1

int radixrt_linear_f32_supported(void) { return 1; }

/* wp [ceil(n / 32) * k * 32] <- w [n, k] (see the top of this file). */
void radixrt_pack_linear_f32(const float *w, float *wp, int64_t n, int64_t k) {
    int64_t panels = (n + GEMM_NR - 1) / GEMM_NR;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++) {
        float *dst = wp + p * k * GEMM_NR;
        for (int64_t kk = 0; kk < k; kk++)
            for (int64_t j = 0; j < GEMM_NR; j++) {
                int64_t col = p * GEMM_NR + j;
                dst[kk * GEMM_NR + j] = col < n ? w[col * k + kk] : 0.0f;
            }
    }
}

/* One MR-row block of one panel: xb [k][MR] (repacked rows), w the panel [k][32], y the block's first
 * output (row stride ldy), ncols the panel's valid columns; pf: a run of lines to prefetch, pf_rate /
 * 65536 of a line per k step (or NULL); pf2: a second run, one line per k step (or NULL). */
#define DEFINE_GEMM_BLOCK(MR)                                                                          \
    static void gemm_block_##MR(const float *xb, const float *w, int64_t k, const float *bias, float *y, \
                                int64_t ldy, int64_t ncols, const float *pf, const float *pf2,       \
                                int64_t pf_rate, int silu) {                                       \
        __m512 acc0[MR], acc1[MR];                                                                     \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                        \
            acc0[i] = _mm512_setzero_ps();                                                             \
            acc1[i] = _mm512_setzero_ps();                                                             \
        }                                                                                              \
        _Pragma("GCC unroll 2") for (int64_t kk = 0; kk < k; kk++) {                                   \
            __m512 b0 = _mm512_load_ps(w + kk * GEMM_NR);                                              \
            __m512 b1 = _mm512_load_ps(w + kk * GEMM_NR + 16);                                         \
            if (pf) _mm_prefetch((const char *)(pf + ((kk * pf_rate) >> 16) * 16), _MM_HINT_T1);       \
            if (pf2) _mm_prefetch((const char *)(pf2 + kk * 16), _MM_HINT_T1);                         \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                    \
                __m512 a = _mm512_set1_ps(xb[kk * MR + i]);                                            \
                acc0[i] = _mm512_fmadd_ps(a, b0, acc0[i]);                                             \
                acc1[i] = _mm512_fmadd_ps(a, b1, acc1[i]);                                             \
            }                                                                                          \
        }                                                                                              \
        __mmask16 m0 = ncols >= 16 ? 0xffff : (__mmask16)((1u << ncols) - 1);                          \
        if (silu) { /* acc0: gate columns, acc1: the same columns of up; y gets silu(gate) * up */     \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                    \
                const v16 g = (v16)acc0[i];                                                            \
                _mm512_mask_storeu_ps(y + i * ldy, m0,                                                 \
                                      (__m512)(g / (exp16((v16){0} - g) + 1.0f) * (v16)acc1[i]));       \
            }                                                                                          \
            return;                                                                                    \
        }                                                                                              \
        __mmask16 m1 = ncols >= 32 ? 0xffff : ncols <= 16 ? 0 : (__mmask16)((1u << (ncols - 16)) - 1); \
        __m512 bias0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();                   \
        __m512 bias1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();              \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                        \
            _mm512_mask_storeu_ps(y + i * ldy, m0, _mm512_add_ps(acc0[i], bias0));                     \
            _mm512_mask_storeu_ps(y + i * ldy + 16, m1, _mm512_add_ps(acc1[i], bias1));                \
        }                                                                                              \
    }
DEFINE_GEMM_BLOCK(1)
DEFINE_GEMM_BLOCK(2)
DEFINE_GEMM_BLOCK(3)
DEFINE_GEMM_BLOCK(4)
DEFINE_GEMM_BLOCK(5)
DEFINE_GEMM_BLOCK(6)
DEFINE_GEMM_BLOCK(7)
DEFINE_GEMM_BLOCK(8)
DEFINE_GEMM_BLOCK(9)
DEFINE_GEMM_BLOCK(10)
DEFINE_GEMM_BLOCK(11)
DEFINE_GEMM_BLOCK(12)
#undef DEFINE_GEMM_BLOCK

typedef void (*gemm_block_fn)(const float *, const float *, int64_t, const float *, float *, int64_t, int64_t,
                              const float *, const float *, int64_t, int);
static const gemm_block_fn gemm_blocks[GEMM_MR + 1] = {
    0, gemm_block_1, gemm_block_2, gemm_block_3, gemm_block_4, gemm_block_5, gemm_block_6,
    gemm_block_7, gemm_block_8, gemm_block_9, gemm_block_10, gemm_block_11, gemm_block_12};

/* y [m, n] = x [m, k] W^T (+ bias [n]) with wp the packed W (silu 0), or (silu 1) y [m, n] =
 * silu(x Wg^T) * (x Wu^T) with wp = radixrt_pack_gate_up_f32(W = [Wg; Wu]) and no bias; xp scratch of
 * m * k floats. All contiguous float32; wp 64-byte aligned. Returns 0, or -1 when m < 1. */
static int linear_f32(const float *x, const float *wp, const float *bias, float *y, int64_t m, int64_t n,
                      int64_t k, float *xp, int silu) {
    if (m < 1) return -1;
    const int64_t cols = silu ? GEMM_NR / 2 : GEMM_NR; /* output columns per panel */
    int64_t panels = (n + cols - 1) / cols;
    int64_t nblk = (m + GEMM_MR - 1) / GEMM_MR;
    int64_t base = m / nblk, extra = m % nblk; /* the first `extra` blocks take one row more */
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t b = 0; b < nblk; b++) {
            int64_t mr = base + (b < extra), r0 = b * base + (b < extra ? b : extra);
            float *dst = xp + r0 * k;
            for (int64_t kk = 0; kk < k; kk++)
                for (int64_t i = 0; i < mr; i++) dst[kk * mr + i] = x[(r0 + i) * k + kk];
        }
#pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; p++) {
            const float *w = wp + p * k * GEMM_NR;
            const float *ahead = p + GEMM_PF_DIST < panels ? w + GEMM_PF_DIST * k * GEMM_NR : 0;
            int64_t ncols = n - p * cols < cols ? n - p * cols : cols;
            int64_t r0 = 0;
            for (int64_t b = 0; b < nblk; b++) {
                int64_t mr = base + (b < extra);
                /* block b prefetches lines [2k b / nblk, 2k (b + 1) / nblk) of the panel ahead (2k lines
                 * of 16 floats), spread over its k steps (pf_rate lines per step, 16.16 fixed point) */
                const float *pf = ahead ? ahead + (2 * k * b / nblk) * 16 : 0;
                const float *pf2 = ahead && nblk == 1 ? ahead + k * 16 : 0;
                int64_t pf_rate = nblk == 1 ? 65536 : 2 * 65536 / nblk;
                gemm_blocks[mr](xp + r0 * k, w, k, bias ? bias + p * cols : 0, y + r0 * n + p * cols, n,
                                ncols, pf, pf2, pf_rate, silu);
                r0 += mr;
            }
        }
    }
    return 0;
}

int radixrt_linear_f32(const float *x, const float *wp, const float *bias, float *y, int64_t m, int64_t n,
                       int64_t k, float *xp) {
    return linear_f32(x, wp, bias, y, m, n, k, xp, 0);
}

/* wp [ceil(n / 16) * k * 32] <- w [2n, k] = [Wg; Wu] (gate rows, then up rows, as a fused gate_up
 * weight): panel p holds gate rows 16p..16p+15 in its columns 0-15 and the same up rows in 16-31
 * (zero past n), so that one panel's outputs are 16 columns of silu(gate) * up. */
void radixrt_pack_gate_up_f32(const float *w, float *wp, int64_t n, int64_t k) {
    const int64_t half = GEMM_NR / 2, panels = (n + half - 1) / half;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++) {
        float *dst = wp + p * k * GEMM_NR;
        for (int64_t kk = 0; kk < k; kk++)
            for (int64_t j = 0; j < GEMM_NR; j++) {
                int64_t col = p * half + j % half;
                dst[kk * GEMM_NR + j] = col < n ? w[(col + (j < half ? 0 : n)) * k + kk] : 0.0f;
            }
    }
}

/* y [m, n] = silu(x Wg^T) * (x Wu^T) (SwiGLU, Shazeer 2020), the SiLU in the GEMM's epilogue; wp =
 * radixrt_pack_gate_up_f32([Wg; Wu]). As radixrt_linear_f32 otherwise. */
int radixrt_linear_silu_f32(const float *x, const float *wp, float *y, int64_t m, int64_t n, int64_t k,
                            float *xp) {
    return linear_f32(x, wp, 0, y, m, n, k, xp, 1);
}

#else /* no AVX-512: callers keep torch's linear */

int radixrt_linear_f32_supported(void) { return 0; }

void radixrt_pack_linear_f32(const float *w, float *wp, int64_t n, int64_t k) {
    (void)w, (void)wp, (void)n, (void)k;
}

int radixrt_linear_f32(const float *x, const float *wp, const float *bias, float *y, int64_t m, int64_t n,
                       int64_t k, float *xp) {
    (void)x, (void)wp, (void)bias, (void)y, (void)m, (void)n, (void)k, (void)xp;
    return -1;
}

void radixrt_pack_gate_up_f32(const float *w, float *wp, int64_t n, int64_t k) {
    (void)w, (void)wp, (void)n, (void)k;
}

int radixrt_linear_silu_f32(const float *x, const float *wp, float *y, int64_t m, int64_t n, int64_t k,
                            float *xp) {
    (void)x, (void)wp, (void)y, (void)m, (void)n, (void)k, (void)xp;
    return -1;
}

#endif
