/* One unit (included by cpu_native.c once per lane count UNIT_LANES, 32, 16 or 8): query vectors
 * qt [D] x UNIT_LANES lanes (nq used) over the item's n slots, KV head h; dc = D / 16 (a constant
 * in each copy of cpu_native.c's UNIT_COPY). lim: NULL, or (a causal item) the lanes' token limits
 * [UNIT_LANES], lane m attending slots [0, lim[m]), non-decreasing over the lanes, the last n.
 * prefetch: prefetch the rows ahead (the first unit of an item and KV head). Writes o [nq][D]
 * (normalised) and lse [nq].
 *
 * The lanes are UNV vectors of UVEC (32: two 16-lane vectors, so each broadcast K element of the
 * score loop feeds two FMAs; 16: one; 8: one 8-lane vector, since Zen 4 runs a 16-lane op as two
 * 8-lane ones and units of at most 8 query vectors would waste half of it). */
#define UNIT_CAT_(a, b) a##b
#define UNIT_CAT(a, b) UNIT_CAT_(a, b)
#if UNIT_LANES == 32 || UNIT_LANES == 16
#define UVEC v16
#define UIVEC i16v
#define UEXP exp_neg16
#define UMAX vmax
#define UNV (UNIT_LANES / 16)
#else
#define UVEC v8
#define UIVEC i8v
#define UEXP exp_neg8
#define UMAX vmax8
#define UNV 1
#endif

/* s[j] = scale * qt . k_j for nk keys at once (a constant where inlined): nk x UNV accumulators,
 * one load of qt[x] per nk broadcast FMAs, one broadcast of k_j[x] per UNV FMAs */
static inline __attribute__((always_inline)) void UNIT_CAT(qk_, UNIT_LANES)(
        const UVEC (*qt)[UNV], int64_t d, const float *const *krow, int nk, float scale, UVEC (*s)[UNV]) {
    UVEC a[QK_KEYS][UNV];
    for (int j = 0; j < nk; j++)
        for (int v = 0; v < UNV; v++) a[j][v] = (UVEC){0};
    for (int64_t x = 0; x < d; x++) {
        UVEC qx[UNV];
        for (int v = 0; v < UNV; v++) qx[v] = qt[x][v];
#pragma GCC unroll 8
        for (int j = 0; j < nk; j++) {
            const float k = krow[j][x];
            for (int v = 0; v < UNV; v++) a[j][v] += qx[v] * k;
        }
    }
    for (int j = 0; j < nk; j++)
        for (int v = 0; v < UNV; v++) s[j][v] = a[j][v] * scale;
}

/* acc[m0 + i][x0 + y] = acc * corr[m0 + i] (only when rescale) + sum_j p_j[m0 + i] v_j[x0 + y] for
 * i < nm, y < nx, p the block's softmax numerators [nb][UNIT_LANES]: an nm x nx block of
 * accumulators in registers over the block's nb keys (nm, nx <= 4, constants where inlined), so
 * each V load serves nm query vectors */
static inline __attribute__((always_inline)) void UNIT_CAT(pv_block_, UNIT_LANES)(
        v16 (*acc)[MAXD / 16], const float (*p)[UNIT_LANES], int rescale, const float *corr,
        const float *const *vrow, int nb, int m0, int nm, int64_t x0, int nx) {
    v16 a[4][4];
    for (int i = 0; i < nm; i++)
        for (int y = 0; y < nx; y++)
            a[i][y] = rescale ? acc[m0 + i][x0 + y] * corr[m0 + i] : acc[m0 + i][x0 + y];
    for (int j = 0; j < nb; j++) {
        const v16u *vr = (const v16u *)vrow[j] + x0;
        v16 vv[4];
        for (int y = 0; y < nx; y++) vv[y] = vr[y];
        for (int i = 0; i < nm; i++) {
            const float pj = p[j][m0 + i];
            for (int y = 0; y < nx; y++) a[i][y] += pj * vv[y];
        }
    }
    for (int i = 0; i < nm; i++)
        for (int y = 0; y < nx; y++) acc[m0 + i][x0 + y] = a[i][y];
}

static inline __attribute__((always_inline)) void UNIT_CAT(attend_unit_, UNIT_LANES)(
        const UVEC (*qt)[UNV], int nq, const int64_t dc, const void *k_buf, const void *v_buf, int kv_bf16,
        int64_t row_stride, int64_t h, const int64_t *slots, int64_t n, const int32_t *lim, float scale,
        int prefetch, float *o, float *lse) {
    const int64_t d = dc * 16;
    v16 acc[UNIT_LANES][MAXD / 16];
    UVEC mx[UNV], l[UNV], s[BT][UNV];
    float kbuf[BT][MAXD], vbuf[BT][MAXD];
    for (int v = 0; v < UNV; v++) {
        mx[v] = (UVEC){0} - INFINITY;
        l[v] = (UVEC){0};
    }
    for (int m = 0; m < nq; m++)
        for (int64_t x = 0; x < dc; x++) acc[m][x] = (v16){0};
    UIVEC limv[UNV]; /* lim as vectors */
    if (lim)
        memcpy(limv, lim, sizeof(limv));
    else
        memset(limv, 0, sizeof(limv));
    for (int64_t t0 = 0; t0 < n; t0 += BT) {
        int nb = (int)(n - t0 < BT ? n - t0 : BT);
        const float *krow[BT], *vrow[BT];
        /* prefetch the K/V rows of the block PF_BLOCKS ahead: one request's rows come from DRAM in
         * page-sized runs; the hardware prefetcher alone keeps too few lines in flight. The other
         * units of the item and KV head find the rows in cache. */
        const int64_t tp = t0 + PF_BLOCKS * BT;
        const int64_t esz = kv_bf16 ? 2 : 4, row_bytes = d * esz;
        for (int64_t j2 = tp; prefetch && j2 < n && j2 < tp + BT; j2++) {
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
        /* scores of all query vectors, QK_KEYS tokens at a time: s[j] = sum_x qt[x] * k_j[x]; a last
         * group of fewer tokens repeats a row (QK_KEYS independent FMA chains take no longer than
         * one: the latency of d dependent FMAs), its extra scores unused */
        for (int j = nb; j < BT && j % QK_KEYS; j++) krow[j] = krow[j - 1];
        int j = 0;
        for (; j < nb; j += QK_KEYS) UNIT_CAT(qk_, UNIT_LANES)(qt, d, krow + j, QK_KEYS, scale, s + j);
        /* online softmax over the block; a lane's running max mx moves only when the block's max
         * exceeds it by more than MAX_SLACK (then exp(s - mx) <= e^MAX_SLACK stays far from
         * overflow), so most blocks skip rescaling the accumulators */
        int rescale = 0;
        UVEC corr[UNV];
        const int masked = lim && t0 + nb > lim[0];
        for (int v = 0; v < UNV; v++) {
            if (masked) /* scores past a lane's limit: -inf */
                for (j = 0; j < nb; j++) {
                    const UIVEC keep = (UIVEC){0} + (int32_t)(t0 + j) < limv[v];
                    s[j][v] = (UVEC)(((UIVEC)s[j][v] & keep) | ((UIVEC)((UVEC){0} - INFINITY) & ~keep));
                }
            UVEC bmax = mx[v];
            for (j = 0; j < nb; j++) bmax = UMAX(s[j][v], bmax);
            const UIVEC up = bmax > mx[v] + MAX_SLACK;
            int any = 0;
            for (int m = 0; m < (int)(sizeof(UVEC) / 4); m++) any |= up[m];
            corr[v] = (UVEC){0} + 1.0f;
            if (any) {
                const UVEC nmx = (UVEC)(((UIVEC)bmax & up) | ((UIVEC)mx[v] & ~up));
                corr[v] = UEXP(mx[v] - nmx);
                mx[v] = nmx;
                l[v] *= corr[v];
                rescale = 1;
            }
            UVEC bsum = {0};
            for (j = 0; j < nb; j++) {
                s[j][v] = UEXP(s[j][v] - mx[v]);
                if (masked) /* exactly 0 (UEXP clamps its argument) */
                    s[j][v] = (UVEC)((UIVEC)s[j][v] & ((UIVEC){0} + (int32_t)(t0 + j) < limv[v]));
                bsum += s[j][v];
            }
            l[v] += bsum;
        }
        /* acc = acc * corr + P V, in register blocks of PV_ROWS query vectors x 4 D-vectors */
        const float(*p)[UNIT_LANES] = (const float(*)[UNIT_LANES])s;
        const float *cf = (const float *)corr;
        for (int64_t x0 = 0; x0 < dc; x0 += 4) {
            const int nx = (int)(dc - x0 < 4 ? dc - x0 : 4);
            int m0 = 0;
            if (nx == 4) {
                for (; m0 + PV_ROWS <= nq; m0 += PV_ROWS)
                    UNIT_CAT(pv_block_, UNIT_LANES)(acc, p, rescale, cf, vrow, nb, m0, PV_ROWS, x0, 4);
                switch (nq - m0) {
                case 3: UNIT_CAT(pv_block_, UNIT_LANES)(acc, p, rescale, cf, vrow, nb, m0, 3, x0, 4); break;
                case 2: UNIT_CAT(pv_block_, UNIT_LANES)(acc, p, rescale, cf, vrow, nb, m0, 2, x0, 4); break;
                case 1: UNIT_CAT(pv_block_, UNIT_LANES)(acc, p, rescale, cf, vrow, nb, m0, 1, x0, 4); break;
                }
            } else {
                for (; m0 < nq; m0 += PV_ROWS) {
                    const int nm = nq - m0 < PV_ROWS ? nq - m0 : PV_ROWS;
                    UNIT_CAT(pv_block_, UNIT_LANES)(acc, p, rescale, cf, vrow, nb, m0, nm, x0, nx);
                }
            }
        }
    }
    const float *mxf = (const float *)mx, *lf = (const float *)l;
    for (int m = 0; m < nq; m++) {
        const float inv = 1.0f / lf[m];
        v16u *dst = (v16u *)(o + m * d);
        for (int64_t x = 0; x < dc; x++) dst[x] = acc[m][x] * inv;
        lse[m] = mxf[m] + logf(lf[m]);
    }
}

#undef UVEC
#undef UIVEC
#undef UEXP
#undef UMAX
#undef UNV
