/* The small float32 ops of a CPU decoder layer that torch runs as several ops each (included by
 * cpu_native.c): the rotary embedding in place, SiLU-and-mul, and the K/V store into the paged pool.
 * Inside a pass each torch op of a [32, 576]-sized tensor cost 2-4x its warm-cache time on the 2-vCPU
 * Xeon VM (2026-12-03, bench/lab/cpu_extend_profile.py: rotary 72 us, SiLU-and-mul 65 us, the two
 * index_copy_ 26 us per layer at 32 rows), so one call replaces each group. Parallel over rows only
 * when a call is large enough to pay for waking the threads. */

/* Rotary embedding (Su et al. 2021), NeoX "rotate-half" layout as in HF Llama, in place:
 * rows r < t of x at x + r * row_stride hold nh heads of d floats (d even); head vector p becomes
 * p[i] = a c_i - b s_i, p[i + d/2] = b c_i + a s_i for a = p[i], b = p[i + d/2], with
 * (c | s) = cos_sin[pos[r]] (a [max_positions, d] float32 table: cos in [:d/2], sin in [d/2:]). */
void radixrt_rotary_f32(float *x, int64_t t, int64_t row_stride, int64_t nh, int64_t d, const int64_t *pos,
                        const float *cos_sin) {
    const int64_t half = d / 2;
#pragma omp parallel for schedule(static) if (t * nh * d >= 262144)
    for (int64_t r = 0; r < t; r++) {
        const float *c = cos_sin + pos[r] * d, *s = c + half;
        for (int64_t h = 0; h < nh; h++) {
            float *p = x + r * row_stride + h * d;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                const float a = p[i], b = p[i + half];
                p[i] = a * c[i] - b * s[i];
                p[i + half] = b * c[i] + a * s[i];
            }
        }
    }
}

/* SwiGLU (Shazeer 2020): out [t, n] = silu(x[:, :n]) * x[:, n:], x [t, 2n] contiguous,
 * silu(g) = g / (1 + exp(-g)). */
void radixrt_silu_mul_f32(const float *x, float *out, int64_t t, int64_t n) {
#pragma omp parallel for schedule(static) if (t * n >= 262144)
    for (int64_t r = 0; r < t; r++) {
        const float *g = x + r * 2 * n, *u = g + n;
        float *o = out + r * n;
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            v16 gv, uv;
            memcpy(&gv, g + i, sizeof gv);
            memcpy(&uv, u + i, sizeof uv);
            const v16 y = gv / (exp16((v16){0} - gv) + 1.0f) * uv;
            memcpy(o + i, &y, sizeof y);
        }
        for (; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* The K/V store of a pass: k_buf[slots[j]] = k[j], v_buf[slots[j]] = v[j] for j < n, each row w
 * floats (Hkv x D); k and v rows at k + j * src_stride, v + j * src_stride (the columns of a fused
 * QKV output), the pool's rows contiguous ([slots, Hkv, D] float32). */
void radixrt_store_kv_f32(float *k_buf, float *v_buf, const float *k, const float *v, int64_t src_stride,
                          const int64_t *slots, int64_t n, int64_t w) {
    for (int64_t j = 0; j < n; j++) {
        memcpy(k_buf + slots[j] * w, k + j * src_stride, sizeof(float) * w);
        memcpy(v_buf + slots[j] * w, v + j * src_stride, sizeof(float) * w);
    }
}
