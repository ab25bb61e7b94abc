/* bpfree's int8 kernel set: one source, two targets.
 *
 * Included by the host simulator's fast path (int8_kernels.c, loaded by bpfree.quant.engine)
 * and by the generated C training engine (bpfree_runtime.c, copied into every export by
 * bpfree.device.export_c). Each function has up to three paths, chosen at compile time:
 *   BPF_AVX2  an x86 host with AVX2 (the simulator's build, -march=native): 8 int32 lanes;
 *   BPF_DSP   a Cortex-M with the DSP extension (M4/M7): SMLAD, SMLAL, QADD, SSAT via ACLE;
 *   neither   portable C99 (any host; what the compiler vectorizes is its business).
 * Every path computes the same integers as the reference arithmetic
 * (bpfree.quant.fixed_point: TFLite's MultiplyByQuantizedMultiplier and AddFunc), so the two
 * programs agree bit for bit with each other and with the simulator's reference layers; the
 * tests compare them on every target.
 *
 * What is shared here: the requantization (the reference form, the one-multiply SMLAL form
 * and the 8-lane AVX2 form) and the residual add, which is element-wise and so the same on
 * both programs' layouts. The convolution loops stay with their programs (see each file's
 * header): the simulator's activations are NHWC with int16-packed weights, the device's
 * NCHW with the int8 weights that the perturbation writes in place.
 */
#ifndef BPF_INT8_H
#define BPF_INT8_H
#include <stdint.h>
#include <string.h>

#if defined(__ARM_FEATURE_DSP)
#include <arm_acle.h>
#define BPF_DSP 1
#else
#define BPF_DSP 0
#endif
#if defined(__AVX2__)
#include <immintrin.h>
#define BPF_AVX2 1
#else
#define BPF_AVX2 0
#endif

#define BPF_I32_MIN (-2147483647LL - 1)
#define BPF_I32_MAX 2147483647LL

static int64_t bpf_sat32(int64_t v) {
    return v < BPF_I32_MIN ? BPF_I32_MIN : (v > BPF_I32_MAX ? BPF_I32_MAX : v);
}

static int32_t bpf_clamp(int64_t v, int32_t lo, int32_t hi) {
    return (int32_t)(v < lo ? lo : (v > hi ? hi : v));
}

/* sat32(a + b) of two int32 (one QADD on the DSP). */
static inline int32_t bpf_sat_add(int32_t a, int32_t b) {
#if BPF_DSP
    return __qadd(a, b);
#else
    return (int32_t)bpf_sat32((int64_t)a + b);
#endif
}

/* ---------------------------------------------------------------------------------------- */
/* Requantization: gemmlowp's MultiplyByQuantizedMultiplier (bpfree.quant.fixed_point)        */
/* ---------------------------------------------------------------------------------------- */

/* The reference form, any multiplier and shift: x << left (saturated), then
 * SaturatingRoundingDoublingHighMul by mult, then RoundingDivideByPOT by right. */
static int64_t bpf_mbqm(int64_t x, int64_t mult, int32_t shift) {
    int32_t left = shift > 0 ? shift : 0, right = shift < 0 ? -shift : 0;
    if (left) x = bpf_sat32(x * ((int64_t)1 << left));
    int64_t h = (x * mult + ((int64_t)1 << 30)) >> 31;
    if (h > BPF_I32_MAX) h = BPF_I32_MAX;
    if (right == 0) return h;
    return (h + ((int64_t)1 << (right - 1)) + (h < 0 ? -1 : 0)) >> right;
}

/* One requantization's constants. mbqm(x) with a right shift r in [2, 31] and a positive
 * multiplier m is one 64-bit multiply-accumulate (SMLAL) and one shift: with T = x m,
 *   (((T + 2^30) >> 31) + 2^(r-1) - [h < 0]) >> r  ==  (T + 2^30 + 2^(30+r) - [x < 0] 2^31) >> (31+r)
 * since floor((floor(a / b) + c) / d) = floor((a + c b) / (b d)), and [h < 0] = [T < -2^30]
 * may be replaced by [T < 0] = [x < 0] (for T in [-2^30, 0) both sides are 0); m > 0 also
 * keeps h below 2^31, so mbqm's cap never applies. The added constant's words are
 * (2^(r-2), 2^30) for x >= 0 and (2^(r-2) - 1, 3 2^30) for x < 0: two instructions from x.
 * Other shifts and multipliers take bpf_mbqm itself (rshift < 0). */
typedef struct {
    int32_t mult, shift;
    int32_t rshift; /* r - 1 >= 1, or -1: not the SMLAL form */
    int32_t high;   /* 2^(r-2) */
} bpf_requant;

static inline bpf_requant bpf_requant_of(int32_t mult, int32_t shift) {
    bpf_requant q;
    q.mult = mult;
    q.shift = shift;
    q.rshift = mult > 0 && shift <= -2 && shift >= -31 ? -shift - 1 : -1;
    q.high = q.rshift >= 0 ? (int32_t)1 << (-shift - 2) : 0;
    return q;
}

/* mbqm(x) in the SMLAL form (q.rshift >= 0). */
static inline int32_t bpf_mbqm_fast(int32_t x, int32_t mult, int32_t high, int32_t rshift) {
    uint32_t lo = ((uint32_t)x & 0x80000000u) | 0x40000000u;
    int32_t hi = high + (x >> 31);
    int64_t t = (int64_t)(((uint64_t)(uint32_t)hi << 32) | lo) + (int64_t)x * mult;
    return (int32_t)(t >> 32) >> rshift;
}

/* mbqm(x, mult, shift) for an int32 x: the SMLAL form, its r = 1 case (the constant is
 * 3 2^30 for x >= 0 and 2^30 for x < 0, and no shift is left), a plain rounding (r = 0,
 * m > 0: no cap), or bpf_mbqm itself. */
static inline int32_t bpf_mbqm_k(const bpf_requant *q, int32_t x) {
    if (q->rshift >= 0) return bpf_mbqm_fast(x, q->mult, q->high, q->rshift);
    if (q->mult > 0 && q->shift == -1)
        return (int32_t)(((int64_t)x * q->mult + (x < 0 ? 0x40000000LL : 0xC0000000LL)) >> 32);
    if (q->mult > 0 && q->shift == 0)
        return (int32_t)(((int64_t)x * q->mult + ((int64_t)1 << 30)) >> 31);
    return (int32_t)bpf_mbqm(x, q->mult, q->shift);
}

/* mbqm(x) + zp for a right shift s = -shift in [1, 31], a positive multiplier m and
 * |x| < 2^30, as one SMMLAR (Cortex-M DSP: (A 2^32 + a b + 2^31) >> 32) and one shift:
 *   SMMLAR(2x, m, A) = A + floor((x m + 2^30) / 2^31) = A + h,  h = SRDHM(x, m) (m > 0: no cap),
 * and RoundingDivideByPOT(h, s) + zp = floor((h + 2^(s-1) - [h < 0]) / 2^s) + zp
 *                                   = (h + A) >> s   with A = 2^(s-1) + zp 2^s - [x < 0]
 * ([h < 0] may be replaced by [x < 0]: for x < 0 <= h, h = 0 and both give 0 when s >= 1).
 * `base` = 2^(s-1) + zp 2^s where h + A cannot leave int32 (|h| <= 2^29 for |x| < 2^30);
 * else (large shifts: channels of tiny scale) base = 2^(s-1), and the caller adds the zero
 * point after the shift (`post`, one more instruction). */
typedef struct {
    int32_t mult, rshift, base, post;
    int32_t ok;   /* the form applies to this multiplier and shift (s >= 1) */
    int32_t ok0;  /* ... or s = 0 (no rounding division: A = zp), through bpf_mbqm_zp_any */
    int32_t neg;  /* -1 where s >= 1 (the [x < 0] term), 0 where s = 0 */
} bpf_rq_smmlar;

static inline bpf_rq_smmlar bpf_rq_smmlar_of(int32_t mult, int32_t shift, int32_t zp) {
    bpf_rq_smmlar q = {mult, -shift, 0, 0, 0, 0, 0};
    if (mult > 0 && shift == 0) { /* h + zp: |h| <= 2^29, no overflow */
        q.base = zp;
        q.ok0 = 1;
    } else if (mult > 0 && shift <= -1 && shift >= -31) {
        int64_t half = (int64_t)1 << (-shift - 1);
        int64_t base = half + (int64_t)zp * ((int64_t)1 << -shift);
        int folds = (base < 0 ? -base : base) + 1 + ((int64_t)1 << 29) < BPF_I32_MAX;
        q.base = (int32_t)(folds ? base : half); /* half + 1 + 2^29 < 2^31 for s <= 31 */
        q.post = folds ? 0 : zp;
        q.ok = q.ok0 = 1;
        q.neg = -1;
    }
    return q;
}

static inline int32_t bpf_smmlar(int32_t x2, int32_t mult, int32_t a) {
#if BPF_DSP
    int32_t r;
    __asm__("smmlar %0, %1, %2, %3" : "=r"(r) : "r"(x2), "r"(mult), "r"(a));
    return r;
#else
    return (int32_t)((((int64_t)a << 32) + (int64_t)x2 * mult + ((int64_t)1 << 31)) >> 32);
#endif
}

/* mbqm(x, mult, shift) + zp - q.post for |x| < 2^30 where q.ok. */
static inline int32_t bpf_mbqm_zp(const bpf_rq_smmlar *q, int32_t x) {
    return bpf_smmlar(x * 2, q->mult, q->base + (x >> 31)) >> q->rshift;
}

/* The same where q.ok0 (one more instruction: the [x < 0] term masked off for s = 0). */
static inline int32_t bpf_mbqm_zp_any(const bpf_rq_smmlar *q, int32_t x) {
    return bpf_smmlar(x * 2, q->mult, q->base + ((x >> 31) & q->neg)) >> q->rshift;
}

#if BPF_AVX2
/* mbqm of eight int32 lanes v by multipliers m in [0, 2^31) and right shifts r in [0, 31]
 * (no left shift), exact where it applies: v * m + 2^30 < 2^62, so bits 31..62 of the 64-bit
 * sum are SaturatingRoundingDoublingHighMul's h (never capped), and a logical shift gives the
 * same low 32 bits as the arithmetic one. RoundingDivideByPOT is gemmlowp's overflow-free
 * form (h >> r) + (rem > (mask >> 1) + (h < 0)). */
static inline __m256i bpf_mbqm8_k(__m256i v, __m256i m, __m256i m_odd, __m256i r,
                                  __m256i mask, __m256i half) {
    __m256i nudge = _mm256_set1_epi64x((int64_t)1 << 30);
    __m256i even = _mm256_srli_epi64(_mm256_add_epi64(_mm256_mul_epi32(v, m), nudge), 31);
    __m256i odd = _mm256_add_epi64(_mm256_mul_epi32(_mm256_srli_epi64(v, 32), m_odd), nudge);
    odd = _mm256_slli_epi64(_mm256_srli_epi64(odd, 31), 32);
    __m256i h = _mm256_blend_epi32(even, odd, 0xAA);
    __m256i rem = _mm256_and_si256(h, mask);
    __m256i thr = _mm256_add_epi32(half, _mm256_srli_epi32(h, 31));
    __m256i up = _mm256_srli_epi32(_mm256_cmpgt_epi32(rem, thr), 31);
    return _mm256_add_epi32(_mm256_srav_epi32(h, r), up);
}

/* The per-lane constants of bpf_mbqm8_k that depend only on m and r: m's odd lanes moved
 * down, the remainder mask 2^r - 1 and its half. A kernel that requantizes many vectors
 * with the same channels computes them once. */
typedef struct {
    __m256i m, m_odd, r, mask, half;
} bpf_mbqm8_consts;

static inline bpf_mbqm8_consts bpf_mbqm8_prepare(__m256i m, __m256i r) {
    bpf_mbqm8_consts k;
    k.m = m;
    k.m_odd = _mm256_srli_epi64(m, 32);
    k.r = r;
    k.mask = _mm256_sub_epi32(_mm256_sllv_epi32(_mm256_set1_epi32(1), r), _mm256_set1_epi32(1));
    k.half = _mm256_srai_epi32(k.mask, 1);
    return k;
}

static inline __m256i bpf_mbqm8(__m256i v, __m256i m, __m256i r) {
    bpf_mbqm8_consts k = bpf_mbqm8_prepare(m, r);
    return bpf_mbqm8_k(v, k.m, k.m_odd, k.r, k.mask, k.half);
}

/* Eight int32 lanes clamped to [lo, hi] (within int8) and stored as eight int8. */
static inline void bpf_store8_s8(__m256i y, int32_t lo, int32_t hi, int8_t *out) {
    y = _mm256_max_epi32(_mm256_min_epi32(y, _mm256_set1_epi32(hi)), _mm256_set1_epi32(lo));
    __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
    _mm_storel_epi64((__m128i *)out, _mm_packs_epi16(p16, p16));
}

static inline __m256i bpf_load8_s8(const int8_t *p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
#endif

/* ---------------------------------------------------------------------------------------- */
/* Residual add: TFLite reference_integer_ops::AddFunc, element-wise (any layout)            */
/* ---------------------------------------------------------------------------------------- */

/* The add's constants in bpfree.quant.layers.QAdd's order. */
typedef struct {
    int32_t input1_offset, input2_offset, left_shift;
    int32_t input1_multiplier, input1_shift, input2_multiplier, input2_shift;
    int32_t output_multiplier, output_shift, output_offset;
} bpf_add_params;

/* out[i] = clamp(mbqm(mbqm((a + o1) << ls, m1, s1) + mbqm((b + o2) << ls, m2, s2), mo, so)
 *                + oo, qmin, qmax).
 * With ls <= 22 every rescaled input fits int32 (|a + o1| <= 255), so each rescaling is one
 * bpf_mbqm_k; the AVX2 lanes further need multipliers below one (shifts <= 0), where every
 * intermediate stays an int32 (|(a + o1) << ls| < 2^30, so each rescaled term is below 2^30
 * in magnitude and their sum an int32). */
static void bpf_add_s8(const int8_t *a, const int8_t *b, int64_t n, const bpf_add_params *k,
                       int32_t qmin, int32_t qmax, int8_t *out) {
    int64_t i = 0;
    if (k->left_shift > 22) { /* the general form (never met by int8 models) */
        int64_t scale = (int64_t)1 << k->left_shift;
        for (; i < n; i++) {
            int64_t h1 = bpf_mbqm((a[i] + (int64_t)k->input1_offset) * scale,
                                  k->input1_multiplier, k->input1_shift);
            int64_t h2 = bpf_mbqm((b[i] + (int64_t)k->input2_offset) * scale,
                                  k->input2_multiplier, k->input2_shift);
            int64_t y = bpf_mbqm(h1 + h2, k->output_multiplier, k->output_shift);
            out[i] = (int8_t)bpf_clamp(y + k->output_offset, qmin, qmax);
        }
        return;
    }
    int32_t o1 = k->input1_offset, o2 = k->input2_offset, sc = (int32_t)1 << k->left_shift;
#if BPF_AVX2
    if (k->input1_shift <= 0 && k->input2_shift <= 0 && k->output_shift <= 0) {
        __m256i vo1 = _mm256_set1_epi32(o1), vo2 = _mm256_set1_epi32(o2);
        __m256i vm1 = _mm256_set1_epi32(k->input1_multiplier);
        __m256i vm2 = _mm256_set1_epi32(k->input2_multiplier);
        __m256i vmo = _mm256_set1_epi32(k->output_multiplier);
        __m256i vr1 = _mm256_set1_epi32(-k->input1_shift);
        __m256i vr2 = _mm256_set1_epi32(-k->input2_shift);
        __m256i vro = _mm256_set1_epi32(-k->output_shift);
        __m256i voo = _mm256_set1_epi32(k->output_offset);
        __m128i ls = _mm_cvtsi32_si128(k->left_shift);
        for (; i + 8 <= n; i += 8) {
            __m256i x1 = _mm256_sll_epi32(_mm256_add_epi32(bpf_load8_s8(a + i), vo1), ls);
            __m256i x2 = _mm256_sll_epi32(_mm256_add_epi32(bpf_load8_s8(b + i), vo2), ls);
            __m256i t = _mm256_add_epi32(bpf_mbqm8(x1, vm1, vr1), bpf_mbqm8(x2, vm2, vr2));
            bpf_store8_s8(_mm256_add_epi32(bpf_mbqm8(t, vmo, vro), voo), qmin, qmax, out + i);
        }
    }
#endif
#if BPF_DSP
    /* The one-SMMLAR form for all three rescalings where ls <= 20 (TFLite's): |(a + o1) << ls|
     * <= 255 2^20 < 2^28, each rescaled input is at most as large (m < 2^31), so their sum
     * stays below 2^29 and every doubled argument an int32. */
    bpf_rq_smmlar f1 = bpf_rq_smmlar_of(k->input1_multiplier, k->input1_shift, 0);
    bpf_rq_smmlar f2 = bpf_rq_smmlar_of(k->input2_multiplier, k->input2_shift, 0);
    bpf_rq_smmlar fo = bpf_rq_smmlar_of(k->output_multiplier, k->output_shift,
                                        k->output_offset);
    if (k->left_shift <= 20 && f1.ok0 && f2.ok0 && fo.ok0)
        for (; i < n; i++) {
            int32_t h = bpf_mbqm_zp_any(&f1, (a[i] + o1) * sc) +
                        bpf_mbqm_zp_any(&f2, (b[i] + o2) * sc);
            out[i] = (int8_t)bpf_clamp(bpf_mbqm_zp_any(&fo, h) + fo.post, qmin, qmax);
        }
#endif
    bpf_requant q1 = bpf_requant_of(k->input1_multiplier, k->input1_shift);
    bpf_requant q2 = bpf_requant_of(k->input2_multiplier, k->input2_shift);
    bpf_requant qo = bpf_requant_of(k->output_multiplier, k->output_shift);
    for (; i < n; i++) {
        int64_t sum = (int64_t)bpf_mbqm_k(&q1, (a[i] + o1) * sc) +
                      bpf_mbqm_k(&q2, (b[i] + o2) * sc);
        int64_t h = sum == (int32_t)sum ? bpf_mbqm_k(&qo, (int32_t)sum)
                                        : bpf_mbqm(sum, k->output_multiplier, k->output_shift);
        out[i] = (int8_t)bpf_clamp(h + k->output_offset, qmin, qmax);
    }
}

#endif
