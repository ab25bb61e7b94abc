/* Channels-last int8 kernels with the TFLite requantization fused into their epilogue.
 *
 * The host's fast backend of bpfree's integer graph (bpfree.quant.engine): int8 in, int8 out,
 * NHWC activations, the int32 accumulator kept in registers and requantized before anything
 * is written. The arithmetic is the reference's integer arithmetic
 * (bpfree.quant.fixed_point.requantize, TFLite's ConvPerChannel epilogue), so the results are
 * bit-identical to the reference layers on any input; the tests compare them.
 *
 *   acc[c]  = sum_k w[c,k] (x[k] - z_x)                   exact int32: |acc| <= K*128*255
 *   v       = sat32(acc + bias[c]);  v = sat32(v * 2^left[c])
 *   h       = (v * mult[c] + 2^30) >> 31                   SaturatingRoundingDoublingHighMul
 *   y       = RoundingDivideByPOT(h, right[c]) + z_out
 *   out     = clamp(y, qmin, qmax)                          the fused ReLU / ReLU6
 *   with a node offset (PMT Eq. 9): out = clamp(clamp(y, -128, 127) + offset, qmin, qmax)
 *
 * With AVX2 the multiply-accumulates run as vpmaddwd on pairs of int16 operands
 * ((x - z_x) and w both fit int16, a pair's sum fits int32) and the epilogue eight channels
 * at a time; without it the same arithmetic runs in portable C. A layer takes the vector
 * epilogue only when the host proved it needs no saturation (see requant8's comment).
 *
 * The requantization and the residual add are the kernel set's (bpf_int8.h), the same code
 * the generated device programs run; the loops here are the channels-last ones of the
 * simulator (the device's are NCHW, over the int8 weights its perturbation edits in place).
 */
#include "bpf_int8.h"

#define MAX_TILE 8 /* output-channel blocks of 8 kept in registers at once (64 channels) */

/* ---------------------------------------------------------------------------------------- */
/* Epilogue                                                                                   */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    const int32_t *bias, *mult, *left, *right; /* per output channel */
    int32_t zero_point, qmin, qmax;
    int32_t vector_ok; /* 1: left == 0 everywhere and |acc + bias| < 2^31 is proven */
} bpf_epilogue;

/* The requantization of bpf_int8.h (TFLite's), with this file's per-channel tables. */
static inline int32_t requant_one(int32_t acc, const bpf_epilogue *e, int c) {
    int64_t v = bpf_sat32((int64_t)acc + e->bias[c]);
    return (int32_t)bpf_mbqm(v, e->mult[c], e->left[c] - e->right[c]) + e->zero_point;
}

static inline int8_t finish_one(int32_t y, const bpf_epilogue *e, const int16_t *offset, int c) {
    if (offset) {
        y = y < -128 ? -128 : (y > 127 ? 127 : y);
        y += offset[c];
    }
    y = y < e->qmin ? e->qmin : (y > e->qmax ? e->qmax : y);
    return (int8_t)y;
}

static void epilogue_scalar(const int32_t *acc, int c0, int c1, const bpf_epilogue *e,
                            const int16_t *offset, int8_t *out) {
    for (int c = c0; c < c1; c++)
        out[c] = finish_one(requant_one(acc[c - c0], e, c), e, offset, c);
}

#if BPF_AVX2
/* Eight channels c..c+7 of the epilogue (bpf_mbqm8). Exact when e->vector_ok: with left == 0
 * and no saturation of acc + bias (checked by the host from the layer's accumulator bound and
 * its largest bias), v is an int32 and the multipliers lie in [0, 2^31). */
static inline __m256i requant8(__m256i acc, const bpf_epilogue *e, int c) {
    __m256i v = _mm256_add_epi32(acc, _mm256_loadu_si256((const __m256i *)(e->bias + c)));
    __m256i y = bpf_mbqm8(v, _mm256_loadu_si256((const __m256i *)(e->mult + c)),
                          _mm256_loadu_si256((const __m256i *)(e->right + c)));
    return _mm256_add_epi32(y, _mm256_set1_epi32(e->zero_point));
}

static inline void store8(__m256i y, const bpf_epilogue *e, const int16_t *offset, int c,
                          int8_t *out) {
    if (offset) {
        y = _mm256_max_epi32(_mm256_min_epi32(y, _mm256_set1_epi32(127)),
                             _mm256_set1_epi32(-128));
        __m128i off16 = _mm_loadu_si128((const __m128i *)(offset + c));
        y = _mm256_add_epi32(y, _mm256_cvtepi16_epi32(off16));
    }
    bpf_store8_s8(y, e->qmin, e->qmax, out + c);
}

/* Channels c..c+7 of an accumulator vector to int8: the vector epilogue where it is exact
 * and all eight channels exist, else the scalar one on the channels that do. */
static inline void finish8(__m256i acc, int c, int c_out, const bpf_epilogue *e,
                           const int16_t *offset, int8_t *out) {
    if (e->vector_ok && c + 8 <= c_out) {
        store8(requant8(acc, e, c), e, offset, c, out);
    } else if (c < c_out) {
        int32_t tmp[8];
        _mm256_storeu_si256((__m256i *)tmp, acc);
        epilogue_scalar(tmp, c, c + 8 < c_out ? c + 8 : c_out, e, offset, out);
    }
}
#endif

/* ---------------------------------------------------------------------------------------- */
/* Dense rows: out[p, :] = epilogue(W x_p), x_p gathered as int16 pairs (x - z_x)            */
/* ---------------------------------------------------------------------------------------- */

/* w: (K2, Cpad, 2) int16, K2 = ceil(K / 2), Cpad = C rounded up to 8 (zero padded).
 * pairs: K2 int32 words, each two int16 (x[2j] - z_x, x[2j+1] - z_x). */
static void row_product(const int32_t *pairs, int k2, const int16_t *w, int c_out, int c_pad,
                        const bpf_epilogue *e, const int16_t *offset, int8_t *out) {
#if BPF_AVX2
    for (int t = 0; t < c_pad; t += 8 * MAX_TILE) {
        int blocks = (c_pad - t) / 8;
        if (blocks > MAX_TILE) blocks = MAX_TILE;
        const int16_t *wt = w + 2 * t;
        /* One copy per tile width B, so that the B accumulators stay in registers (the
         * multiply-accumulate and the epilogue loops both have a constant trip count). */
#define TILE(B)                                                                              \
        {                                                                                    \
            __m256i acc[B];                                                                  \
            for (int b = 0; b < (B); b++) acc[b] = _mm256_setzero_si256();                   \
            for (int j = 0; j < k2; j++) {                                                   \
                __m256i xp = _mm256_set1_epi32(pairs[j]);                                    \
                const int16_t *wj = wt + (int64_t)j * 2 * c_pad;                             \
                for (int b = 0; b < (B); b++)                                                \
                    acc[b] = _mm256_add_epi32(acc[b], _mm256_madd_epi16(                     \
                        xp, _mm256_loadu_si256((const __m256i *)(wj + 16 * b))));            \
            }                                                                                \
            for (int b = 0; b < (B); b++) finish8(acc[b], t + 8 * b, c_out, e, offset, out); \
        }
        switch (blocks) {
            case 1: TILE(1) break;
            case 2: TILE(2) break;
            case 3: TILE(3) break;
            case 4: TILE(4) break;
            case 5: TILE(5) break;
            case 6: TILE(6) break;
            case 7: TILE(7) break;
            default: TILE(8) break;
        }
#undef TILE
    }
#else
    int32_t acc[8];
    for (int c = 0; c < c_out; c += 8) {
        int c1 = c + 8 < c_out ? c + 8 : c_out;
        for (int i = 0; i < 8; i++) acc[i] = 0;
        for (int j = 0; j < k2; j++) {
            int32_t pr = pairs[j];
            int32_t lo = (int16_t)(pr & 0xFFFF), hi = (int16_t)((uint32_t)pr >> 16);
            const int16_t *wj = w + (int64_t)j * 2 * c_pad + 2 * c;
            for (int i = 0; i < c1 - c; i++) acc[i] += lo * wj[2 * i] + hi * wj[2 * i + 1];
        }
        epilogue_scalar(acc, c, c1, e, offset, out);
    }
#endif
}


#if BPF_AVX2
/* store8 of requant8 with the channels' constants prepared by the caller (bpf_mbqm8_prepare,
 * once per call): acc + bias, the multiply and shift, the zero point, the offset, the clamp. */
static inline void requant_store8(__m256i acc, __m256i bias, const bpf_mbqm8_consts *k,
                                  __m256i zp, const bpf_epilogue *e, const int16_t *offset,
                                  int c, int8_t *out) {
    __m256i v = _mm256_add_epi32(acc, bias);
    store8(_mm256_add_epi32(bpf_mbqm8_k(v, k->m, k->m_odd, k->r, k->mask, k->half), zp), e,
           offset, c, out);
}
#endif

#if BPF_AVX2
/* Dense rows when every output channel fits in registers (C = 8 * B, B <= MAX_TILE) and the
 * vector epilogue is exact: the same arithmetic as row_product + finish8, with the row loop
 * inside, so the epilogue's per-channel constants are prepared once per call rather than
 * once per row, and each row's (x - z_x) is built with 16- and 8-lane vector stores (which
 * the pair loads then read whole) instead of scalar ones. The PMT step's point-wise layers
 * are all this case (8 to 64 channels, K = 8 to 32), where per-row overhead, not the
 * multiply-accumulates, bounded row_product. */
static inline __attribute__((always_inline)) void dense_rows(
        const int8_t *x, int64_t rows, int k, int32_t zx, const int16_t *w,
        const bpf_epilogue *e, const int16_t *offset, int8_t *out, int16_t *vals, const int B) {
    const int k2 = (k + 1) / 2, c_out = 8 * B;
    bpf_mbqm8_consts kc[MAX_TILE];
    __m256i bias[MAX_TILE];
    for (int b = 0; b < B; b++) {
        kc[b] = bpf_mbqm8_prepare(_mm256_loadu_si256((const __m256i *)(e->mult + 8 * b)),
                                  _mm256_loadu_si256((const __m256i *)(e->right + 8 * b)));
        bias[b] = _mm256_loadu_si256((const __m256i *)(e->bias + 8 * b));
    }
    const __m256i zp = _mm256_set1_epi32(e->zero_point);
    const __m256i zx16 = _mm256_set1_epi16((int16_t)zx);
    vals[2 * k2 - 1] = 0; /* odd K: the pad pair's half (its weight is 0 too) */
    const int32_t *pairs = (const int32_t *)vals;
    for (int64_t p = 0; p < rows; p++) {
        const int8_t *xp = x + p * k;
        int j = 0;
        for (; j + 16 <= k; j += 16)
            _mm256_storeu_si256((__m256i *)(vals + j), _mm256_sub_epi16(
                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(xp + j))), zx16));
        for (; j + 8 <= k; j += 8)
            _mm_storeu_si128((__m128i *)(vals + j), _mm_sub_epi16(
                _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(xp + j))),
                _mm256_castsi256_si128(zx16)));
        for (; j < k; j++) vals[j] = (int16_t)(xp[j] - zx);
        __m256i acc[MAX_TILE];
        for (int b = 0; b < B; b++) acc[b] = _mm256_setzero_si256();
        for (int jj = 0; jj < k2; jj++) {
            __m256i xv = _mm256_set1_epi32(pairs[jj]);
            const int16_t *wj = w + (int64_t)jj * 2 * c_out;
            for (int b = 0; b < B; b++)
                acc[b] = _mm256_add_epi32(acc[b], _mm256_madd_epi16(
                    xv, _mm256_loadu_si256((const __m256i *)(wj + 16 * b))));
        }
        int8_t *op = out + p * c_out;
        const int16_t *off = offset ? offset + p * c_out : 0;
        for (int b = 0; b < B; b++)
            requant_store8(acc[b], bias[b], &kc[b], zp, e, off, 8 * b, op);
    }
}
#endif

/* Fully connected: x (rows, K) int8 -> out (rows, C) int8. scratch: ceil(K/2) int32. */
void bpf_dense(const int8_t *x, int64_t rows, int k, int32_t zx, const int16_t *w, int c_out,
               int c_pad, const bpf_epilogue *e, const int16_t *offset, int8_t *out,
               int32_t *scratch) {
    int k2 = (k + 1) / 2;
    int16_t *vals = (int16_t *)scratch; /* 2 * k2 int16: one row's (x - z_x), zero padded */
#if BPF_AVX2
    if (e->vector_ok && c_out == c_pad && c_out <= 8 * MAX_TILE) {
        switch (c_out / 8) { /* a constant B per copy: the accumulators stay in registers */
            case 1: dense_rows(x, rows, k, zx, w, e, offset, out, vals, 1); return;
            case 2: dense_rows(x, rows, k, zx, w, e, offset, out, vals, 2); return;
            case 3: dense_rows(x, rows, k, zx, w, e, offset, out, vals, 3); return;
            case 4: dense_rows(x, rows, k, zx, w, e, offset, out, vals, 4); return;
            case 5: dense_rows(x, rows, k, zx, w, e, offset, out, vals, 5); return;
            case 6: dense_rows(x, rows, k, zx, w, e, offset, out, vals, 6); return;
            case 7: dense_rows(x, rows, k, zx, w, e, offset, out, vals, 7); return;
            case 8: dense_rows(x, rows, k, zx, w, e, offset, out, vals, 8); return;
        }
    }
#endif
    vals[2 * k2 - 1] = 0;
    for (int64_t p = 0; p < rows; p++) {
        const int8_t *xp = x + p * k;
        for (int j = 0; j < k; j++) vals[j] = (int16_t)(xp[j] - zx); /* vectorised */
        row_product(scratch, k2, w, c_out, c_pad, e, offset ? offset + p * c_out : 0,
                    out + p * c_out);
    }
}

/* Dense convolution (groups = 1), NHWC: x (N, H, W, Ci), out (N, OH, OW, Co); the reduction
 * runs over (kh, kw, ci) in that order; w packed accordingly. Padded taps are the real zero
 * (x = z_x), so they contribute 0. scratch: ceil(KH*KW*Ci/2) int32. */
void bpf_conv(const int8_t *x, int n, int h, int wd, int ci, int32_t zx, const int16_t *w,
              int kh, int kw, int co, int c_pad, int sh, int sw, int ph, int pw, int dh, int dw,
              int oh, int ow, const bpf_epilogue *e, const int16_t *offset, int8_t *out,
              int32_t *scratch) {
    int k = kh * kw * ci, k2 = (k + 1) / 2;
    int16_t *vals = (int16_t *)scratch; /* one output pixel's gathered (x - z_x), as pairs */
    for (int b = 0; b < n; b++)
        for (int y = 0; y < oh; y++)
            for (int xo = 0; xo < ow; xo++) {
                int idx = 0;
                for (int i = 0; i < kh; i++) {
                    int iy = y * sh - ph + i * dh;
                    for (int j = 0; j < kw; j++) {
                        int ix = xo * sw - pw + j * dw;
                        if (iy < 0 || iy >= h || ix < 0 || ix >= wd) {
                            for (int c = 0; c < ci; c++) vals[idx++] = 0;
                        } else {
                            const int8_t *px = x + (((int64_t)b * h + iy) * wd + ix) * ci;
                            for (int c = 0; c < ci; c++) vals[idx++] = (int16_t)(px[c] - zx);
                        }
                    }
                }
                vals[2 * k2 - 1] = vals[2 * k2 - 1] * (k % 2 == 0); /* zero pad when k is odd */
                int64_t o = (((int64_t)b * oh + y) * ow + xo) * co;
                row_product(scratch, k2, w, co, c_pad, e, offset ? offset + o : 0, out + o);
            }
}

#if BPF_AVX2
/* One output pixel of a depthwise convolution whose taps all lie inside the input (no
 * padding reached), eight channels at a time: sum_t w_t x_t - z_x sum_t w_t, the second sum
 * precomputed per channel (wz), which is the reference's sum_t w_t (x_t - z_x) exactly (all
 * int32: |w x| <= 128 * 128 per tap). The tap offsets and the epilogue's constants come
 * from the caller, computed once per call. */
static inline __attribute__((always_inline)) void depthwise_interior(
                                      const int8_t *px, int c_n, const int32_t *w,
                                      const int64_t *tap, int taps, const int32_t *wz,
                                      const bpf_epilogue *e, const bpf_mbqm8_consts *kc,
                                      const int16_t *off, int8_t *out) {
    const __m256i zp = _mm256_set1_epi32(e->zero_point);
    for (int c = 0; c < c_n; c += 8) {
        __m256i acc = _mm256_sub_epi32(_mm256_setzero_si256(),
                                       _mm256_loadu_si256((const __m256i *)(wz + c)));
        for (int t = 0; t < taps; t++)
            acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(
                bpf_load8_s8(px + tap[t] + c),
                _mm256_loadu_si256((const __m256i *)(w + (int64_t)t * c_n + c))));
        requant_store8(acc, _mm256_loadu_si256((const __m256i *)(e->bias + c)), kc + c / 8, zp,
                       e, off, c, out);
    }
}
#endif

/* Depthwise convolution (groups = C = Co), NHWC; w: (KH, KW, C) int32. */
void bpf_depthwise(const int8_t *x, int n, int h, int wd, int c_n, int32_t zx, const int32_t *w,
                   int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw, int oh, int ow,
                   const bpf_epilogue *e, const int16_t *offset, int8_t *out) {
#if BPF_AVX2
    /* The interior fast path: all eight-channel blocks vector-exact, taps at fixed offsets. */
    int fast = e->vector_ok && c_n % 8 == 0 && kh * kw <= 64 && c_n <= 4096;
    int64_t tap[64];
    int32_t wz[fast ? c_n : 1];
    bpf_mbqm8_consts kc[fast ? c_n / 8 : 1];
    if (fast) {
        for (int i = 0; i < kh; i++)
            for (int j = 0; j < kw; j++)
                tap[i * kw + j] = ((int64_t)i * dh * wd + (int64_t)j * dw) * c_n;
        for (int c = 0; c < c_n; c++) {
            int32_t sum = 0;
            for (int t = 0; t < kh * kw; t++) sum += w[(int64_t)t * c_n + c];
            wz[c] = sum * zx;
        }
        for (int c = 0; c < c_n; c += 8)
            kc[c / 8] = bpf_mbqm8_prepare(_mm256_loadu_si256((const __m256i *)(e->mult + c)),
                                          _mm256_loadu_si256((const __m256i *)(e->right + c)));
    }
#endif
    for (int b = 0; b < n; b++)
        for (int y = 0; y < oh; y++)
            for (int xo = 0; xo < ow; xo++) {
                int64_t o = (((int64_t)b * oh + y) * ow + xo) * c_n;
                const int16_t *off = offset ? offset + o : 0;
                int c = 0;
#if BPF_AVX2
                int iy0 = y * sh - ph, ix0 = xo * sw - pw;
                if (fast && iy0 >= 0 && ix0 >= 0 && iy0 + (kh - 1) * dh < h &&
                    ix0 + (kw - 1) * dw < wd) {
                    const int8_t *px = x + (((int64_t)b * h + iy0) * wd + ix0) * c_n;
                    if (kh * kw == 9) /* 3x3: a constant tap count, unrolled */
                        depthwise_interior(px, c_n, w, tap, 9, wz, e, kc, off, out + o);
                    else
                        depthwise_interior(px, c_n, w, tap, kh * kw, wz, e, kc, off, out + o);
                    continue;
                }
                __m256i vzx = _mm256_set1_epi32(zx);
                if (fast) { /* a border pixel: the taps inside, listed once for all channels */
                    int64_t toff[64], tw[64];
                    int nt = 0;
                    for (int i = 0; i < kh; i++) {
                        int iy = iy0 + i * dh;
                        if (iy < 0 || iy >= h) continue;
                        for (int j = 0; j < kw; j++) {
                            int ix = ix0 + j * dw;
                            if (ix < 0 || ix >= wd) continue;
                            toff[nt] = (((int64_t)b * h + iy) * wd + ix) * c_n;
                            tw[nt++] = ((int64_t)i * kw + j) * c_n;
                        }
                    }
                    const __m256i zp = _mm256_set1_epi32(e->zero_point);
                    for (; c < c_n; c += 8) {
                        __m256i acc = _mm256_setzero_si256();
                        for (int t = 0; t < nt; t++)
                            acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(
                                _mm256_sub_epi32(bpf_load8_s8(x + toff[t] + c), vzx),
                                _mm256_loadu_si256((const __m256i *)(w + tw[t] + c))));
                        requant_store8(acc,
                                       _mm256_loadu_si256((const __m256i *)(e->bias + c)),
                                       kc + c / 8, zp, e, off, c, out + o);
                    }
                    continue;
                }
                for (; c + 8 <= c_n; c += 8) {
                    __m256i acc = _mm256_setzero_si256();
                    for (int i = 0; i < kh; i++) {
                        int iy = y * sh - ph + i * dh;
                        if (iy < 0 || iy >= h) continue;
                        for (int j = 0; j < kw; j++) {
                            int ix = xo * sw - pw + j * dw;
                            if (ix < 0 || ix >= wd) continue;
                            const int8_t *px = x + (((int64_t)b * h + iy) * wd + ix) * c_n + c;
                            __m256i xv = _mm256_sub_epi32(
                                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)px)), vzx);
                            __m256i wv = _mm256_loadu_si256(
                                (const __m256i *)(w + ((int64_t)i * kw + j) * c_n + c));
                            acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(xv, wv));
                        }
                    }
                    if (e->vector_ok) {
                        store8(requant8(acc, e, c), e, off, c, out + o);
                    } else {
                        int32_t tmp[8];
                        _mm256_storeu_si256((__m256i *)tmp, acc);
                        epilogue_scalar(tmp, c, c + 8, e, off, out + o);
                    }
                }
#endif
                for (; c < c_n; c += 8) {
                    int c1 = c + 8 < c_n ? c + 8 : c_n;
                    int32_t acc[8] = {0};
                    for (int i = 0; i < kh; i++) {
                        int iy = y * sh - ph + i * dh;
                        if (iy < 0 || iy >= h) continue;
                        for (int j = 0; j < kw; j++) {
                            int ix = xo * sw - pw + j * dw;
                            if (ix < 0 || ix >= wd) continue;
                            const int8_t *px = x + (((int64_t)b * h + iy) * wd + ix) * c_n;
                            const int32_t *wp = w + ((int64_t)i * kw + j) * c_n;
                            for (int q = c; q < c1; q++) acc[q - c] += (px[q] - zx) * wp[q];
                        }
                    }
                    epilogue_scalar(acc, c, c1, e, off, out + o);
                }
            }
}

/* Global average pooling, NHWC: x (N, count, C) int8 -> out (N, C) int8, TFLite's integer
 * MEAN (bpfree.quant.layers.QGlobalAvgPool2d.from_sums): acc = sum(x) - z_in count (exact:
 * the host refuses count * 255 > INT32_MAX), then
 *   divide = 1 ("reference"): out = clamp(z_out + round_div(mbqm(acc, mult, shift), count))
 *   divide = 0 ("litert", 1/count folded into mult and shift by the host):
 *                            out = clamp(z_out + mbqm(acc, mult, shift)).
 * sums: C int32 of scratch. */
void bpf_global_avg_pool(const int8_t *x, int n, int count, int c_n, int32_t zin, int64_t mult,
                         int32_t shift, int32_t divide, int32_t zout, int32_t *sums,
                         int8_t *out) {
    for (int b = 0; b < n; b++) {
        const int8_t *xb = x + (int64_t)b * count * c_n;
        for (int c = 0; c < c_n; c++) sums[c] = 0;
        for (int p = 0; p < count; p++) /* contiguous channels: vectorised */
            for (int c = 0; c < c_n; c++) sums[c] += xb[(int64_t)p * c_n + c];
        for (int c = 0; c < c_n; c++) {
            int64_t acc = bpf_mbqm((int64_t)sums[c] - (int64_t)zin * count, mult, shift);
            if (divide) { /* round half away from zero, C division truncating toward zero */
                int64_t half = count / 2;
                acc = (acc > 0 ? acc + half : acc - half) / count;
            }
            out[(int64_t)b * c_n + c] = (int8_t)bpf_clamp(acc + zout, -128, 127);
        }
    }
}

/* The residual add (bpf_int8.h's bpf_add_s8, element-wise on any layout). */
void bpf_add(const int8_t *a, const int8_t *b, int64_t n, const bpf_add_params *k,
             int32_t qmin, int32_t qmax, int8_t *out) {
    bpf_add_s8(a, b, n, k, qmin, qmax, out);
}

/* Which path this build took: 1 with AVX2, 0 portable. */
int bpf_vector_width(void) {
#if BPF_AVX2
    return 8;
#else
    return 1;
#endif
}
