/* Native CPU kernels: paged attention reading K/V straight from the pool's slots (no gather), for
 * decodes and short extends, a float32 RMSNorm with its residual add, (cpu_native_gemm.h) the
 * float32 linear of small passes, and (cpu_native_ops.h) the rotary embedding, SiLU-and-mul and the
 * K/V store.
 *
 * Compiled once per machine by radixrt/worker/cpu_native.py (cc -O3 -march=native -fopenmp -shared) and
 * called through ctypes; the OpenMP runtime is the one torch already loaded (libgomp.so.1), so the
 * kernel uses torch's intra-op threads (torch.set_num_threads).
 *
 * Work: "items", each a list of pool slots (one request's tokens, the shared prefix of a group of
 * decode requests: cascade inference, Ye et al. 2024, an extend's cached prefix, or an extend's new
 * tokens: a causal item, its m-th member seeing only the slots up to its own) and the query rows
 * ("members") that attend them. Per item and KV head, the members' R = Hq / Hkv query heads are
 * query vectors, up to QV of them one unit of work; a unit keeps its query vectors transposed
 * ([D][lanes], lanes over the vectors: 32, 16 or 8 lanes, the fewest that hold them), so a key row
 * gives the scores of all of them with D broadcast FMAs and no horizontal sums, and runs the online
 * softmax of FlashAttention (Dao et al. 2022) over blocks of BT tokens. Both loops of a block are
 * register-blocked: the scores QK_KEYS keys at a time (each load of a query column serves QK_KEYS
 * FMAs; in a 32-lane unit each broadcast key element serves two), the P V product in blocks of
 * PV_ROWS query vectors x 4 D-vectors (each load of a V row serves PV_ROWS FMAs). The running max
 * moves only when a score passes it by MAX_SLACK, so most blocks leave the accumulators unscaled.
 * Each (item, member) pair writes one partial output and its log-sum-exp; a second loop merges the
 * partials of each decode row (the split-KV merge of FlashDecoding, Dao et al. 2023).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __AVX512F__ /* 32 vector registers: a 32-lane unit's 2 x 8 score accumulators, P V's 4 x 4 */
#define QV 32      /* query vectors per unit at most (lanes of the score loop) */
#define QK_KEYS 8  /* keys per step of the score loop */
#define PV_ROWS 4  /* query vectors per register block of the P V loop */
#else /* 16 registers of 8 floats (a 16-float vector takes two): smaller register blocks */
#define QV 16
#define QK_KEYS 4
#define PV_ROWS 1
#endif
#define BT 16   /* tokens per online-softmax block (a multiple of QK_KEYS) */
#define MAXD 256
#define PF_BLOCKS 2 /* software prefetch distance, in blocks */
#define MAX_SLACK 8.0f /* a unit's running max lags the scores by at most this (online softmax) */

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef int32_t i16v __attribute__((vector_size(64)));

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t i8v __attribute__((vector_size(32)));

/* Per vector width (VT float lanes, IT int32 lanes): MAXF(a, b) the lane-wise max, and EXPF(x) =
 * exp(x) for x <= MAX_SLACK (below -87: ~exp(-87)): 2^(x log2 e) = 2^n 2^f, n = round(t) (the 1.5 *
 * 2^23 trick), |f| <= 1/2, degree-6 Taylor of e^(f ln 2) (relative error ~1.2e-7), no libm call. */
#define DEFINE_VEC_MATH(VT, IT, MAXF, EXPF)                               \
    static inline VT MAXF(VT a, VT b) {                                   \
        IT m = a > b;                                                     \
        return (VT)(((IT)a & m) | ((IT)b & ~m));                          \
    }                                                                     \
    static inline VT EXPF(VT x) {                                         \
        x = MAXF(x, (VT){0} - 87.0f);                                     \
        VT t = x * 1.4426950408889634f;                                   \
        VT n = (t + 12582912.0f) - 12582912.0f;                           \
        VT f = (t - n) * 0.6931471805599453f;                             \
        VT p = f * 1.3888889e-3f + 8.3333333e-3f;                         \
        p = p * f + 4.1666667e-2f;                                        \
        p = p * f + 1.6666667e-1f;                                        \
        p = p * f + 0.5f;                                                 \
        p = p * f + 1.0f;                                                 \
        p = p * f + 1.0f;                                                 \
        IT bits = (__builtin_convertvector(n, IT) + 127) << 23;           \
        return p * (VT)bits;                                              \
    }
DEFINE_VEC_MATH(v16, i16v, vmax, exp_neg16)
DEFINE_VEC_MATH(v8, i8v, vmax8, exp_neg8)

/* exp(x) for any float x (clamped to [-87, 88]: exp(88) < FLT_MAX), as exp_neg16 with
 * the upper clamp: degree-6 Taylor of 2^f, relative error ~1.2e-7. */
static inline v16 exp16(v16 x) {
    const v16 hi = (v16){0} + 88.0f;
    const i16v below = x < hi; /* min(x, 88) lane-wise; exp_neg16 clamps at -87 */
    return exp_neg16((v16)(((i16v)x & below) | ((i16v)hi & ~below)));
}

static inline float exp_neg(float x) {
    v16 v = {x};
    return exp_neg16(v)[0];
}

static inline void bf16_row(const uint16_t *src, int64_t d, float *dst) {
    for (int64_t x = 0; x < d; x++) {
        uint32_t u = (uint32_t)src[x] << 16;
        memcpy(dst + x, &u, 4);
    }
}

#define UNIT_LANES 32
#include "cpu_native_unit.h"
#undef UNIT_LANES
#define UNIT_LANES 16
#include "cpu_native_unit.h"
#undef UNIT_LANES
#define UNIT_LANES 8
#include "cpu_native_unit.h"
#undef UNIT_LANES

/* One out-of-line copy of a unit per lane count L and D / 16 (DC: 4, 8, or 0 for any): GCC
 * allocates registers per function, and a copy shares them with no other. */
#define UNIT_COPY(L, T, NV, DC)                                                                        \
    static __attribute__((noinline)) void unit_##L##_##DC(                                             \
            const float *qt, int nq, int64_t dc, const void *k_buf, const void *v_buf, int kv_bf16,    \
            int64_t row_stride, int64_t h, const int64_t *slots, int64_t n, const int32_t *lim,        \
            float scale, int prefetch, float *o, float *lse) {                                         \
        attend_unit_##L((const T(*)[NV])qt, nq, DC ? DC : dc, k_buf, v_buf, kv_bf16, row_stride, h,   \
                        slots, n, lim, scale, prefetch, o, lse);                                       \
    }
UNIT_COPY(32, v16, 2, 4)
UNIT_COPY(32, v16, 2, 8)
UNIT_COPY(32, v16, 2, 0)
UNIT_COPY(16, v16, 1, 4)
UNIT_COPY(16, v16, 1, 8)
UNIT_COPY(16, v16, 1, 0)
UNIT_COPY(8, v8, 1, 4)
UNIT_COPY(8, v8, 1, 8)
UNIT_COPY(8, v8, 1, 0)
#undef UNIT_COPY

/* qt: lanes = 32 (nq > 16), 16 (nq > 8) or 8 floats per x, stored as floats [D][lanes] */
static void attend_unit_any(const float *qt, int nq, int64_t dc, const void *k_buf, const void *v_buf,
                            int kv_bf16, int64_t row_stride, int64_t h, const int64_t *slots, int64_t n,
                            const int32_t *lim, float scale, int prefetch, float *o, float *lse) {
    const int L = nq > 16 ? 32 : nq > 8 ? 16 : 8;
#define UNIT_CALL(F) \
    F(qt, nq, dc, k_buf, v_buf, kv_bf16, row_stride, h, slots, n, lim, scale, prefetch, o, lse)
    if (L == 32)
        dc == 4 ? UNIT_CALL(unit_32_4) : dc == 8 ? UNIT_CALL(unit_32_8) : UNIT_CALL(unit_32_0);
    else if (L == 16)
        dc == 4 ? UNIT_CALL(unit_16_4) : dc == 8 ? UNIT_CALL(unit_16_8) : UNIT_CALL(unit_16_0);
    else
        dc == 4 ? UNIT_CALL(unit_8_4) : dc == 8 ? UNIT_CALL(unit_8_8) : UNIT_CALL(unit_8_0);
#undef UNIT_CALL
}

/* Returns 0, or -1 when d > MAXD or d is not a multiple of 16. Shapes (all int64 index arrays, fp32 tensors contiguous
 * but q, whose rows are q_row_stride floats apart):
 *   q [n_rows, hq, d] fp32: the decode rows' queries; k_buf, v_buf [slots, hkv, d] fp32 or bf16;
 *   item i: slots[item_slot_off[i] : + item_ntok[i]], members mem_row[item_mem_off[i] : + item_nmem[i]]
 *   (rows of q), partial of its m-th member = item_part_off[i] + m; item_causal[i] 1: its m-th member
 *   attends only the first item_ntok[i] - item_nmem[i] + m + 1 slots (an extend's new tokens);
 *   part_o [n_parts, hq, d], part_lse [n_parts, hq] fp32 scratch;
 *   row r's partials: row_parts[row_part_ptr[r] : row_part_ptr[r + 1]]; out [n_rows, hq, d] fp32. */
int radixrt_decode_attention(const float *q, int64_t q_row_stride, const void *k_buf, const void *v_buf,
                             int kv_bf16, int64_t hq, int64_t hkv, int64_t d, int64_t n_items,
                             const int64_t *item_slot_off, const int64_t *item_ntok,
                             const int64_t *item_mem_off, const int64_t *item_nmem,
                             const int64_t *item_part_off, const int64_t *item_causal, const int64_t *mem_row,
                             const int64_t *slots,
                             float scale, float *part_o, float *part_lse, int64_t n_rows,
                             const int64_t *row_part_ptr, const int64_t *row_parts, float *out) {
    if (d > MAXD || d % 16 != 0) return -1;
    const int64_t rep = hq / hkv, row_stride = hkv * d;
    /* units: (item, kv head, chunk of QV query vectors) */
    int64_t *unit_first = (int64_t *)malloc(sizeof(int64_t) * (n_items + 1));
    unit_first[0] = 0;
    for (int64_t i = 0; i < n_items; i++) {
        int64_t chunks = (item_nmem[i] * rep + QV - 1) / QV;
        unit_first[i + 1] = unit_first[i] + hkv * chunks;
    }
    const int64_t n_units = unit_first[n_items];
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t u = 0; u < n_units; u++) {
        int64_t lo = 0, hi = n_items; /* item of unit u: unit_first[i] <= u < unit_first[i + 1] */
        while (hi - lo > 1) {
            int64_t mid = (lo + hi) / 2;
            if (unit_first[mid] <= u) lo = mid; else hi = mid;
        }
        const int64_t i = lo, chunks = (item_nmem[i] * rep + QV - 1) / QV;
        const int64_t h = (u - unit_first[i]) / chunks, c = (u - unit_first[i]) % chunks;
        const int64_t v0 = c * QV, nvec_all = item_nmem[i] * rep;
        const int nq = (int)(nvec_all - v0 < QV ? nvec_all - v0 : QV);
        v16 qt[MAXD * QV / 16]; /* [d][lanes] floats, lanes = 32, 16 or 8 (attend_unit_any) */
        float *qf = (float *)qt;
        const int lanes = nq > 16 ? 32 : nq > 8 ? 16 : 8;
        float o[QV * MAXD], lse[QV];
        memset(qt, 0, sizeof(float) * d * lanes);
        for (int m = 0; m < nq; m++) { /* vector v = member * rep + head-in-group */
            int64_t v = v0 + m, mem = v / rep, r = v % rep;
            const float *src = q + mem_row[item_mem_off[i] + mem] * q_row_stride + (h * rep + r) * d;
            for (int64_t x = 0; x < d; x++) qf[x * lanes + m] = src[x];
        }
        /* a causal item: lane m's member attends the first lim[m] slots, the unit the first n */
        int32_t lim[32]; /* [QV], and read as [lanes] */
        int64_t n = item_ntok[i];
        if (item_causal[i]) {
            for (int m = 0; m < nq; m++) lim[m] = (int32_t)(n - item_nmem[i] + (v0 + m) / rep + 1);
            n = lim[nq - 1];
            for (int m = nq; m < 32; m++) lim[m] = (int32_t)n;
        }
        attend_unit_any(qf, nq, d / 16, k_buf, v_buf, kv_bf16, row_stride, h, slots + item_slot_off[i], n,
                        item_causal[i] ? lim : NULL, scale, c == 0, o, lse);
        for (int m = 0; m < nq; m++) {
            int64_t v = v0 + m, mem = v / rep, r = v % rep, head = h * rep + r;
            int64_t part = item_part_off[i] + mem;
            memcpy(part_o + (part * hq + head) * d, o + m * d, sizeof(float) * d);
            part_lse[part * hq + head] = lse[m];
        }
    }
    free(unit_first);
#pragma omp parallel for schedule(static)
    for (int64_t rh = 0; rh < n_rows * hq; rh++) {
        const int64_t r = rh / hq, head = rh % hq;
        const int64_t p0 = row_part_ptr[r], p1 = row_part_ptr[r + 1];
        float *dst = out + rh * d;
        float m = -INFINITY;
        for (int64_t p = p0; p < p1; p++) {
            float x = part_lse[row_parts[p] * hq + head];
            m = x > m ? x : m;
        }
        float wsum = 0.0f;
        memset(dst, 0, sizeof(float) * d);
        for (int64_t p = p0; p < p1; p++) {
            const int64_t part = row_parts[p];
            float w = exp_neg(part_lse[part * hq + head] - m);
            wsum += w;
            const float *src = part_o + (part * hq + head) * d;
#pragma omp simd
            for (int64_t x = 0; x < d; x++) dst[x] += w * src[x];
        }
        float inv = 1.0f / wsum;
#pragma omp simd
        for (int64_t x = 0; x < d; x++) dst[x] *= inv;
    }
    return 0;
}


/* RMSNorm with the residual add fused (Zhang & Sennrich 2019), float32, rows of h elements:
 * s = x + res (res NULL: s = x), new_res = s (skipped when new_res is NULL), out = w * s / sqrt(mean(s^2) + eps).
 * x, res, w, out, new_res contiguous; out may not alias x or res. Parallel over rows only when the
 * call is large enough to pay for waking the threads. */
void radixrt_rms_norm(const float *x, const float *res, const float *w, float *out, float *new_res,
                      int64_t rows, int64_t h, float eps) {
#pragma omp parallel for schedule(static) if (rows * h >= 262144)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * h;
        const float *rr = res ? res + r * h : NULL;
        float *orow = out + r * h;
        float *nr = new_res ? new_res + r * h : NULL;
        float ss = 0.0f;
        if (rr) {
#pragma omp simd reduction(+ : ss)
            for (int64_t i = 0; i < h; i++) {
                float s = xr[i] + rr[i];
                orow[i] = s;
                ss += s * s;
            }
        } else {
#pragma omp simd reduction(+ : ss)
            for (int64_t i = 0; i < h; i++) {
                orow[i] = xr[i];
                ss += xr[i] * xr[i];
            }
        }
        if (nr) memcpy(nr, orow, sizeof(float) * h);
        const float inv = 1.0f / sqrtf(ss / (float)h + eps);
#pragma omp simd
        for (int64_t i = 0; i < h; i++) orow[i] = w[i] * (orow[i] * inv);
    }
}

/* The float32 linear of small passes (radixrt_pack_linear_f32, radixrt_linear_f32): cpu_native_gemm.h */
#include "cpu_native_gemm.h"

/* Rotary embedding, SiLU-and-mul and the K/V store: cpu_native_ops.h */
#include "cpu_native_ops.h"
