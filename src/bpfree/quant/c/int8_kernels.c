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


/* Fully connected: x (rows, K) int8 -> out (rows, C) int8. scratch: ceil(K/2) int32. */
void bpf_dense(const int8_t *x, int64_t rows, int k, int32_t zx, const int16_t *w, int c_out,
               int c_pad, const bpf_epilogue *e, const int16_t *offset, int8_t *out,
               int32_t *scratch) {
    int k2 = (k + 1) / 2;
    int16_t *vals = (int16_t *)scratch; /* 2 * k2 int16: one row's (x - z_x), zero padded */
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

/* Depthwise convolution (groups = C = Co), NHWC; w: (KH, KW, C) int32. */
void bpf_depthwise(const int8_t *x, int n, int h, int wd, int c_n, int32_t zx, const int32_t *w,
                   int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw, int oh, int ow,
                   const bpf_epilogue *e, const int16_t *offset, int8_t *out) {
    for (int b = 0; b < n; b++)
        for (int y = 0; y < oh; y++)
            for (int xo = 0; xo < ow; xo++) {
                int64_t o = (((int64_t)b * oh + y) * ow + xo) * c_n;
                const int16_t *off = offset ? offset + o : 0;
                int c = 0;
#if BPF_AVX2
                __m256i vzx = _mm256_set1_epi32(zx);
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
