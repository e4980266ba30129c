/* One unit (included by cpu_native.c once per lane count UNIT_LANES, 16 or 8; Zen 4 runs a 16-lane op
 * as two 8-lane ones, so units of at most 8 query vectors take the 8-lane copy): query vectors
 * qt [D] x UNIT_LANES lanes (nq used) over the item's n slots, KV head h; dc = D / 16 (a constant
 * in each inlined copy). Writes o [nq][D] (normalised) and lse [nq]. */
#define UNIT_CAT_(a, b) a##b
#define UNIT_CAT(a, b) UNIT_CAT_(a, b)
#if UNIT_LANES == 16
#define UVEC v16
#define UEXP exp_neg16
#define UMAX vmax
#else
#define UVEC v8
#define UEXP exp_neg8
#define UMAX vmax8
#endif

static inline __attribute__((always_inline)) void UNIT_CAT(attend_unit_, UNIT_LANES)(
        const UVEC *qt, int nq, const int64_t dc, const void *k_buf, const void *v_buf, int kv_bf16,
        int64_t row_stride, int64_t h, const int64_t *slots, int64_t n, float scale, float *o, float *lse) {
    const int64_t d = dc * 16;
    v16 acc[UNIT_LANES][MAXD / 16];
    UVEC mx, l, s[BT];
    float kbuf[BT][MAXD], vbuf[BT][MAXD];
    for (int m = 0; m < UNIT_LANES; m++) {
        mx[m] = -INFINITY;
        l[m] = 0.0f;
    }
    memset(acc, 0, sizeof(acc));
    for (int64_t t0 = 0; t0 < n; t0 += BT) {
        int nb = (int)(n - t0 < BT ? n - t0 : BT);
        const float *krow[BT], *vrow[BT];
        /* prefetch the K/V rows of the block PF_BLOCKS ahead: one request's rows come from DRAM in
         * page-sized runs; the hardware prefetcher alone keeps too few lines in flight */
        const int64_t tp = t0 + PF_BLOCKS * BT;
        const int64_t esz = kv_bf16 ? 2 : 4, row_bytes = d * esz;
        for (int64_t j2 = tp; j2 < n && j2 < tp + BT; j2++) {
            const char *kp = (const char *)k_buf + (slots[j2] * row_stride + h * d) * esz;
            const char *vp = (const char *)v_buf + (slots[j2] * row_stride + h * d) * esz;
            for (int64_t b = 0; b < row_bytes; b += 64) {
                __builtin_prefetch(kp + b, 0, 3);
                __builtin_prefetch(vp + b, 0, 3);
            }
        }
        for (int j = 0; j < nb; j++) {
            int64_t off = slots[t0 + j] * row_stride + h * d;
            if (kv_bf16) {
                bf16_row((const uint16_t *)k_buf + off, d, kbuf[j]);
                bf16_row((const uint16_t *)v_buf + off, d, vbuf[j]);
                krow[j] = kbuf[j];
                vrow[j] = vbuf[j];
            } else {
                krow[j] = (const float *)k_buf + off;
                vrow[j] = (const float *)v_buf + off;
            }
        }
        /* scores of all query vectors for four tokens at a time: s[j] = sum_x qt[x] * k_j[x] */
        int j = 0;
        for (; j + 4 <= nb; j += 4) {
            UVEC s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
            const float *k0 = krow[j], *k1 = krow[j + 1], *k2 = krow[j + 2], *k3 = krow[j + 3];
            for (int64_t x = 0; x < d; x++) {
                UVEC qx = qt[x];
                s0 += qx * k0[x];
                s1 += qx * k1[x];
                s2 += qx * k2[x];
                s3 += qx * k3[x];
            }
            s[j] = s0 * scale;
            s[j + 1] = s1 * scale;
            s[j + 2] = s2 * scale;
            s[j + 3] = s3 * scale;
        }
        for (; j < nb; j++) {
            UVEC s0 = {0};
            const float *k0 = krow[j];
            for (int64_t x = 0; x < d; x++) s0 += qt[x] * k0[x];
            s[j] = s0 * scale;
        }
        /* online softmax over the block */
        UVEC bmax = mx;
        for (j = 0; j < nb; j++) bmax = UMAX(s[j], bmax);
        UVEC corr = UEXP(mx - bmax), bsum = {0};
        mx = bmax;
        for (j = 0; j < nb; j++) {
            s[j] = UEXP(s[j] - bmax);
            bsum += s[j];
        }
        l = l * corr + bsum;
        for (int m = 0; m < nq; m++) {
            v16 a[MAXD / 16];
            const float c = corr[m];
            for (int64_t x = 0; x < dc; x++) a[x] = acc[m][x] * c;
            for (j = 0; j < nb; j++) {
                const float p = s[j][m];
                const v16u *vr = (const v16u *)vrow[j];
                for (int64_t x = 0; x < dc; x++) a[x] += p * vr[x];
            }
            for (int64_t x = 0; x < dc; x++) acc[m][x] = a[x];
        }
    }
    for (int m = 0; m < nq; m++) {
        const float inv = 1.0f / l[m];
        v16u *dst = (v16u *)(o + m * d);
        for (int64_t x = 0; x < dc; x++) dst[x] = acc[m][x] * inv;
        lse[m] = mx[m] + logf(l[m]);
    }
}

#undef UVEC
#undef UEXP
#undef UMAX
