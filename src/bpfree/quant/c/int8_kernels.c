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
 * ((x - z_x) and w both fit int16, a pair's sum fits int32; a depthwise layer pairs two taps)
 * and the epilogue eight channels at a time; without it the same arithmetic runs in portable
 * C. A layer takes the vector epilogue only when the host proved it needs no saturation (see
 * requant8's comment). Padded convolutions run on a copy of their input framed by its zero
 * point (framed_input), so that no pixel tests which of its taps lie inside.
 *
 * The requantization and the residual add are the kernel set's (bpf_int8.h), the same code
 * the generated device programs run; the loops here are the channels-last ones of the
 * simulator (the device's are NCHW, over the int8 weights its perturbation edits in place).
 */
#include <stdlib.h>

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
/* One row's (x - z_x) as int16, written with 16- and 8-lane vector stores: the int32 pair
 * loads that follow then read inside one store, which the core forwards (a load spanning two
 * scalar stores waits for them to reach the cache). */
static inline void row_values(const int8_t *xp, int k, int32_t zx, __m256i zx16, int16_t *vals) {
    int j = 0;
    for (; j + 16 <= k; j += 16)
        _mm256_storeu_si256((__m256i *)(vals + j), _mm256_sub_epi16(
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(xp + j))), zx16));
    for (; j + 8 <= k; j += 8)
        _mm_storeu_si128((__m128i *)(vals + j), _mm_sub_epi16(
            _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(xp + j))),
            _mm256_castsi256_si128(zx16)));
    if (j < k) {
        /* The last k - j < 8 values gathered in a register and written by one 8-lane store,
         * for the same reason: int16 stores read back by an int32 pair load wait for both
         * (K = 2 cost more per output than K = 8 did). Lanes past K are 0: odd K's pad
         * pair half (its weight is 0 too). Every caller's buffer holds K rounded up to 8. */
        uint64_t bytes = 0;
        for (int i = k - j - 1; i >= 0; i--) bytes = bytes << 8 | (uint8_t)xp[j + i];
        __m128i v = _mm_sub_epi16(_mm_cvtepi8_epi16(_mm_cvtsi64_si128((int64_t)bytes)),
                                  _mm256_castsi256_si128(zx16));
        __m128i keep = _mm_cmpgt_epi16(_mm_set1_epi16((int16_t)(k - j)),
                                       _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7));
        _mm_storeu_si128((__m128i *)(vals + j), _mm_and_si128(v, keep));
    }
}

/* The epilogue's per-channel vectors for B blocks of 8 channels, prepared once per call. */
typedef struct {
    bpf_mbqm8_consts kc[MAX_TILE];
    __m256i bias[MAX_TILE], zp;
} tile_epilogue;

static inline __attribute__((always_inline)) void tile_epilogue_of(const bpf_epilogue *e,
                                                                   tile_epilogue *t, int B) {
    for (int b = 0; b < B; b++) {
        t->kc[b] = bpf_mbqm8_prepare(_mm256_loadu_si256((const __m256i *)(e->mult + 8 * b)),
                                     _mm256_loadu_si256((const __m256i *)(e->right + 8 * b)));
        t->bias[b] = _mm256_loadu_si256((const __m256i *)(e->bias + 8 * b));
    }
    t->zp = _mm256_set1_epi32(e->zero_point);
}

/* out[0 .. 8B) = epilogue(W x) for one row given as K2 int32 pairs: B accumulators in
 * registers (w: (K2, 8B, 2) int16). */
static inline __attribute__((always_inline)) void tile_row(
        const int32_t *pairs, int k2, const int16_t *w, const tile_epilogue *t,
        const bpf_epilogue *e, const int16_t *offset, int8_t *out, const int B) {
    __m256i acc[MAX_TILE];
    for (int b = 0; b < B; b++) acc[b] = _mm256_setzero_si256();
    for (int j = 0; j < k2; j++) {
        __m256i xv = _mm256_set1_epi32(pairs[j]);
        const int16_t *wj = w + (int64_t)j * 16 * B;
        for (int b = 0; b < B; b++)
            acc[b] = _mm256_add_epi32(acc[b], _mm256_madd_epi16(
                xv, _mm256_loadu_si256((const __m256i *)(wj + 16 * b))));
    }
    for (int b = 0; b < B; b++)
        requant_store8(acc[b], t->bias[b], &t->kc[b], t->zp, e, offset, 8 * b, out);
}

/* Two rows of tile_row at once: 2B independent accumulator chains, which the core overlaps
 * (one row's one or two chains leave it waiting on the multiply-add latency). */
static inline __attribute__((always_inline)) void tile_row_pair(
        const int32_t *pa, const int32_t *pb, int k2, const int16_t *w, const tile_epilogue *t,
        const bpf_epilogue *e, const int16_t *offset, int8_t *out, const int B) {
    __m256i aa[MAX_TILE], ab[MAX_TILE];
    for (int b = 0; b < B; b++) aa[b] = ab[b] = _mm256_setzero_si256();
    for (int j = 0; j < k2; j++) {
        __m256i xa = _mm256_set1_epi32(pa[j]), xb = _mm256_set1_epi32(pb[j]);
        const int16_t *wj = w + (int64_t)j * 16 * B;
        for (int b = 0; b < B; b++) {
            __m256i wv = _mm256_loadu_si256((const __m256i *)(wj + 16 * b));
            aa[b] = _mm256_add_epi32(aa[b], _mm256_madd_epi16(xa, wv));
            ab[b] = _mm256_add_epi32(ab[b], _mm256_madd_epi16(xb, wv));
        }
    }
    const int16_t *ob = offset ? offset + 8 * B : 0;
    for (int b = 0; b < B; b++) {
        requant_store8(aa[b], t->bias[b], &t->kc[b], t->zp, e, offset, 8 * b, out);
        requant_store8(ab[b], t->bias[b], &t->kc[b], t->zp, e, ob, 8 * b, out + 8 * B);
    }
}

/* Dense rows when every output channel fits in registers (C = 8 * B, B <= MAX_TILE) and the
 * vector epilogue is exact: the same arithmetic as row_product + finish8, with the row loop
 * inside, so the epilogue's per-channel constants are prepared once per call rather than
 * once per row, and each row's (x - z_x) is built with vector stores (row_values). The PMT
 * step's point-wise layers are all this case (8 to 64 channels, K = 8 to 32), where per-row
 * overhead and latency, not the multiply-accumulates, bounded row_product: for B <= 2 the
 * rows go in pairs (tile_row_pair), where K is small enough for the second row's values to
 * sit on the stack. */
static inline __attribute__((always_inline)) void dense_rows(
        const int8_t *x, int64_t rows, int k, int32_t zx, const int16_t *w,
        const bpf_epilogue *e, const int16_t *offset, int8_t *out, int16_t *vals, const int B) {
    const int k2 = (k + 1) / 2, c_out = 8 * B;
    tile_epilogue t;
    tile_epilogue_of(e, &t, B);
    const __m256i zx16 = _mm256_set1_epi16((int16_t)zx);
    int64_t p = 0;
    enum { PAIR_K = 256 };
    if (k <= PAIR_K && B <= 2) {
        int16_t second[PAIR_K + 2] __attribute__((aligned(32)));
        for (; p + 2 <= rows; p += 2) {
            row_values(x + p * k, k, zx, zx16, vals);
            row_values(x + (p + 1) * k, k, zx, zx16, second);
            if (offset)
                tile_row_pair((const int32_t *)vals, (const int32_t *)second, k2, w, &t, e,
                              offset + p * c_out, out + p * c_out, B);
            else /* a copy without the offset's tests in every store */
                tile_row_pair((const int32_t *)vals, (const int32_t *)second, k2, w, &t, e, 0,
                              out + p * c_out, B);
        }
    }
    for (; p < rows; p++) {
        row_values(x + p * k, k, zx, zx16, vals);
        tile_row((const int32_t *)vals, k2, w, &t, e, offset ? offset + p * c_out : 0,
                 out + p * c_out, B);
    }
}

/* An input copied into a frame of its zero point z_x, ph rows and pw columns wide (NHWC):
 * padded taps are the real zero (x = z_x contributes w (z_x - z_x) = 0), so a convolution
 * over the framed input with no padding gives the same sums, and no pixel has to test which
 * of its taps lie inside. NULL when out of memory (the caller keeps its bounds-testing
 * loop). The caller frees it. */
static int8_t *framed_input(const int8_t *x, int n, int h, int wd, int c, int32_t zx, int ph,
                            int pw) {
    int hp = h + 2 * ph, wp = wd + 2 * pw;
    int8_t *framed = malloc((size_t)n * hp * wp * c);
    if (!framed) return 0;
    size_t row = (size_t)wp * c, side = (size_t)pw * c, inner = (size_t)wd * c;
    for (int b = 0; b < n; b++) {
        int8_t *fb = framed + (int64_t)b * hp * row;
        memset(fb, (int8_t)zx, ph * row);                  /* top rows */
        memset(fb + (ph + h) * row, (int8_t)zx, ph * row); /* bottom rows */
        for (int y = 0; y < h; y++) {
            int8_t *fr = fb + (ph + y) * row;
            memset(fr, (int8_t)zx, side);
            memcpy(fr + side, x + ((int64_t)b * h + y) * inner, inner);
            memset(fr + side + inner, (int8_t)zx, side);
        }
    }
    return framed;
}

/* One output pixel's taps (x - z_x) from a framed input (taps at fixed offsets from px), as
 * int32 pairs written whole (see row_values: a pair load of two int16 stores would wait for
 * both to reach the cache). Returns the number of pairs, K2. */
static inline __attribute__((always_inline)) int conv_pairs(
        const int8_t *px, const int64_t *tap, int taps, int ci, int32_t zx, int32_t *pairs) {
    int idx = 0;
    uint32_t lo = 0;
    for (int t = 0; t < taps; t++)
        for (int c = 0; c < ci; c++, idx++) {
            uint32_t v = (uint16_t)(int16_t)(px[tap[t] + c] - zx);
            if (idx & 1)
                pairs[idx >> 1] = (int32_t)(lo | (v << 16));
            else
                lo = v;
        }
    if (idx & 1) pairs[idx >> 1] = (int32_t)lo; /* odd K: the pad pair's half is 0 */
    return (idx + 1) / 2;
}

/* bpf_conv over an unpadded (or framed) input where every output channel fits in registers
 * and the vector epilogue is exact (MobileNet's stem: Ci = 1 or 3, 3x3, 8 to 32 channels):
 * the gathered pixel goes through tile_row with the epilogue's constants prepared once per
 * call. Constant taps and ci unroll the gather. */
static inline __attribute__((always_inline)) void conv_tiles(
        const int8_t *x, int n, int h, int wd, int ci, int32_t zx, const int16_t *w,
        const int64_t *tap, int taps, int sh, int sw, int oh, int ow, const bpf_epilogue *e,
        const int16_t *offset, int8_t *out, int32_t *pairs, const int B) {
    tile_epilogue t;
    tile_epilogue_of(e, &t, B);
    const int64_t step = (int64_t)sw * ci;
    for (int b = 0; b < n; b++)
        for (int y = 0; y < oh; y++) {
            const int8_t *px = x + ((int64_t)b * h + (int64_t)y * sh) * wd * ci;
            int64_t o = ((int64_t)b * oh + y) * ow * 8 * B;
            for (int xo = 0; xo < ow; xo++, px += step, o += 8 * B) {
                int k2 = conv_pairs(px, tap, taps, ci, zx, pairs);
                tile_row(pairs, k2, w, &t, e, offset ? offset + o : 0, out + o, B);
            }
        }
}

/* conv_tiles with a constant B (the accumulators stay in registers) and, for the stems
 * met in practice, constant taps and channels. */
static inline __attribute__((always_inline)) void conv_tiles_b(
        const int8_t *x, int n, int h, int wd, int ci, int32_t zx, const int16_t *w,
        const int64_t *tap, int taps, int sh, int sw, int oh, int ow, const bpf_epilogue *e,
        const int16_t *offset, int8_t *out, int32_t *pairs, const int B) {
    if (taps == 9 && ci == 1)
        conv_tiles(x, n, h, wd, 1, zx, w, tap, 9, sh, sw, oh, ow, e, offset, out, pairs, B);
    else if (taps == 9 && ci == 3)
        conv_tiles(x, n, h, wd, 3, zx, w, tap, 9, sh, sw, oh, ow, e, offset, out, pairs, B);
    else
        conv_tiles(x, n, h, wd, ci, zx, w, tap, taps, sh, sw, oh, ow, e, offset, out, pairs, B);
}
#endif

/* Fully connected: x (rows, K) int8 -> out (rows, C) int8. scratch: 4 ceil(K/8) int32. */
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
#if BPF_AVX2
    if (e->vector_ok && co == c_pad && co <= 8 * MAX_TILE && kh * kw <= 64) {
        int8_t *framed = ph > 0 || pw > 0 ? framed_input(x, n, h, wd, ci, zx, ph, pw) : 0;
        if (framed || (ph == 0 && pw == 0)) {
            int hf = h + 2 * ph, wf = wd + 2 * pw;
            int64_t tap[64];
            for (int i = 0; i < kh; i++)
                for (int j = 0; j < kw; j++)
                    tap[i * kw + j] = ((int64_t)i * dh * wf + (int64_t)j * dw) * ci;
            const int8_t *src = framed ? framed : x;
#define CONV_TILES(B) conv_tiles_b(src, n, hf, wf, ci, zx, w, tap, kh * kw, sh, sw, oh, ow, e, \
                                   offset, out, scratch, B)
            switch (co / 8) { /* a constant B per copy: the accumulators stay in registers */
                case 1: CONV_TILES(1); break;
                case 2: CONV_TILES(2); break;
                case 3: CONV_TILES(3); break;
                case 4: CONV_TILES(4); break;
                case 5: CONV_TILES(5); break;
                case 6: CONV_TILES(6); break;
                case 7: CONV_TILES(7); break;
                default: CONV_TILES(8); break;
            }
#undef CONV_TILES
            free(framed);
            return;
        }
    }
#endif
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

#if BPF_AVX2
/* Sixteen channels' taps in pairs, for depthwise_interior16: wp[(t/2) * 2 * C + ...] holds,
 * per pair of taps (t, t+1) and per block of 16 channels, the two int16 vectors that
 * _mm256_unpacklo/hi_epi16 of the two taps' inputs meet in _mm256_madd_epi16: channels
 * {0-3, 8-11} then {4-7, 12-15}, each as (w_t, w_t+1) pairs (w_t+1 = 0 past the last tap). */
static void depthwise_tap_pairs(const int32_t *w, int taps, int c_n, int16_t *wp) {
    for (int t = 0; t < taps; t += 2)
        for (int c = 0; c < c_n; c += 16) {
            int16_t *dst = wp + (int64_t)(t / 2) * 2 * c_n + 2 * c;
            for (int half = 0; half < 2; half++)     /* unpacklo, then unpackhi */
                for (int lane = 0; lane < 2; lane++) /* 128-bit lanes: channels 0-7, 8-15 */
                    for (int i = 0; i < 4; i++) {
                        int ch = c + 8 * lane + 4 * half + i;
                        int16_t *q = dst + 16 * half + 8 * lane + 2 * i;
                        q[0] = (int16_t)w[(int64_t)t * c_n + ch];
                        q[1] = t + 1 < taps ? (int16_t)w[(int64_t)(t + 1) * c_n + ch] : 0;
                    }
        }
}

/* depthwise_interior, sixteen channels at a time (C % 16 == 0), two taps per
 * _mm256_madd_epi16: the raw int8 inputs of taps t and t+1 interleaved as int16 pairs meet
 * the pair table of depthwise_tap_pairs; |x w| <= 2^14, so a pair's sum is exact in int32,
 * and the sums are the same integers as depthwise_interior's, z_x sum_t w_t subtracted alike. */
static inline __attribute__((always_inline)) void depthwise_interior16(
        const int8_t *px, int c_n, const int16_t *wp, const int64_t *tap, int taps,
        const int32_t *wz, const bpf_epilogue *e, const bpf_mbqm8_consts *kc,
        const int16_t *off, int8_t *out) {
    const __m256i zp = _mm256_set1_epi32(e->zero_point);
    for (int c = 0; c < c_n; c += 16) {
        __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
        for (int t = 0; t < taps; t += 2) {
            __m256i xa = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(px + tap[t] + c)));
            __m256i xb = t + 1 < taps ? _mm256_cvtepi8_epi16(
                _mm_loadu_si128((const __m128i *)(px + tap[t + 1] + c))) : _mm256_setzero_si256();
            const int16_t *wt = wp + (int64_t)(t / 2) * 2 * c_n + 2 * c;
            lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(xa, xb),
                                                        _mm256_loadu_si256((const __m256i *)wt)));
            hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(xa, xb),
                                                        _mm256_loadu_si256((const __m256i *)(wt + 16))));
        }
        __m256i a0 = _mm256_permute2x128_si256(lo, hi, 0x20); /* channels 0-7 */
        __m256i a1 = _mm256_permute2x128_si256(lo, hi, 0x31); /* channels 8-15 */
        a0 = _mm256_sub_epi32(a0, _mm256_loadu_si256((const __m256i *)(wz + c)));
        a1 = _mm256_sub_epi32(a1, _mm256_loadu_si256((const __m256i *)(wz + c + 8)));
        requant_store8(a0, _mm256_loadu_si256((const __m256i *)(e->bias + c)), kc + c / 8, zp,
                       e, off, c, out);
        requant_store8(a1, _mm256_loadu_si256((const __m256i *)(e->bias + c + 8)),
                       kc + c / 8 + 1, zp, e, off, c + 8, out);
    }
}
#endif

#if BPF_AVX2
/* Every output pixel of a depthwise convolution whose taps never reach padding (no padding,
 * or a framed input): row pointers advanced by the stride instead of recomputed and tested
 * per pixel. Called with constant taps / c_n / offset / paired where it matters, so that
 * each copy unrolls its tap and channel loops. */
static inline __attribute__((always_inline)) void depthwise_pixels(
        const int8_t *x, int n, int h, int wd, int c_n, int sh, int sw, int oh, int ow,
        const int32_t *w, const int16_t *wp, const int64_t *tap, int taps, const int32_t *wz,
        const bpf_epilogue *e, const bpf_mbqm8_consts *kc, const int16_t *offset,
        int8_t *out, const int paired) {
    const int64_t step = (int64_t)sw * c_n;
    for (int b = 0; b < n; b++)
        for (int y = 0; y < oh; y++) {
            const int8_t *px = x + ((int64_t)b * h + (int64_t)y * sh) * wd * c_n;
            int64_t o = ((int64_t)b * oh + y) * ow * c_n;
            for (int xo = 0; xo < ow; xo++, px += step, o += c_n) {
                const int16_t *off = offset ? offset + o : 0;
                if (paired)
                    depthwise_interior16(px, c_n, wp, tap, taps, wz, e, kc, off, out + o);
                else
                    depthwise_interior(px, c_n, w, tap, taps, wz, e, kc, off, out + o);
            }
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
    if (fast && (ph > 0 || pw > 0)) {
        /* Every pixel an interior one on the framed input (framed_input): border pixels
         * would otherwise list their taps one by one (on a 7x7 map, half the pixels are
         * border ones). */
        int8_t *framed = framed_input(x, n, h, wd, c_n, zx, ph, pw);
        if (framed) {
            bpf_depthwise(framed, n, h + 2 * ph, wd + 2 * pw, c_n, zx, w, kh, kw, sh, sw, 0, 0,
                          dh, dw, oh, ow, e, offset, out);
            free(framed);
            return;
        }
    }
    int64_t tap[64];
    int32_t wz[fast ? c_n : 1];
    bpf_mbqm8_consts kc[fast ? c_n / 8 : 1];
    /* Sixteen channels at a time, taps in pairs, where the pair table fits 32 KB of stack. */
    int64_t pair_table = (int64_t)(kh * kw + 1) / 2 * 2 * c_n;
    int paired = fast && c_n % 16 == 0 && pair_table <= 16384;
    int16_t wp[paired ? pair_table : 1] __attribute__((aligned(32)));
    if (paired) depthwise_tap_pairs(w, kh * kw, c_n, wp);
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
    if (fast && ph == 0 && pw == 0) { /* every pixel an interior one */
        int taps = kh * kw;
#define PIXELS(C, T, OFF, PAIRED) depthwise_pixels(x, n, h, wd, C, sh, sw, oh, ow, w, wp, tap, T, \
                                                   wz, e, kc, OFF, out, PAIRED)
        if (paired && taps == 9 && !offset && c_n == 16) PIXELS(16, 9, 0, 1); /* MobileNet's */
        else if (paired && taps == 9 && !offset) PIXELS(c_n, 9, 0, 1);
        else if (paired && taps == 9) PIXELS(c_n, 9, offset, 1);
        else if (paired) PIXELS(c_n, taps, offset, 1);
        else if (taps == 9) PIXELS(c_n, 9, offset, 0);
        else PIXELS(c_n, taps, offset, 0);
#undef PIXELS
        return;
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
                    if (paired && kh * kw == 9) /* 3x3: a constant tap count, unrolled */
                        depthwise_interior16(px, c_n, wp, tap, 9, wz, e, kc, off, out + o);
                    else if (paired)
                        depthwise_interior16(px, c_n, wp, tap, kh * kw, wz, e, kc, off, out + o);
                    else if (kh * kw == 9)
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
