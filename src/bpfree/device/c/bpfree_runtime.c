/* bpfree device runtime. Every kernel mirrors a bpfree.quant layer (TFLite int8 reference
 * semantics) and the step mirrors bpfree.pmt.exact, operation for operation; see those modules
 * for the equations. Compile with -ffp-contract=off: the update's float64 products must not
 * be fused. */
#include "bpfree_runtime.h"
#include "bpf_int8.h" /* the int8 kernel set shared with the simulator (requantization, add) */
#include <math.h>
#include <stddef.h>
#include <string.h>

#define LOSS_BITS 24
#define EXP_BITS 30
#define LN2_Q 744261118LL /* round(ln 2 * 2^30) */
/* Every kernel is its own function, never inlined into run_op: then its code, and so its
 * instruction count, is the same in the build that reads the counter around each operator
 * (BPFREE_KERNEL_COUNTS) as in the plain one, whatever else run_op holds. */
#define KERNEL __attribute__((noinline))

/* PMT Appendix F: xor_rand() on a 32-bit unsigned state. */
static uint32_t xorshift32(uint32_t s) {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    return s;
}
#define RADEMACHER(s) (((s) & 1u) ? -1 : 1)

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* bpfree.perturb.derive_seed: SplitMix64 mixing of (base, indices) into [1, 2^32 - 1]. */
uint32_t bpf_derive_seed(uint64_t base, int count, const uint64_t *indices) {
    const uint64_t golden = 0x9E3779B97F4A7C15ULL;
    uint64_t h = mix64(base + (uint64_t)(count + 1) * golden);
    for (int i = 0; i < count; i++) h = mix64((h ^ indices[i]) + golden);
    return (uint32_t)(h % 0xFFFFFFFFULL + 1);
}

static int64_t rounding_divide(int64_t acc, int64_t count) {
    int64_t half = count / 2;
    return (acc > 0 ? acc + half : acc - half) / count;
}

static int8_t *tensor_at(bpf_model *m, int32_t t, const uint32_t *placement) {
    return m->arena + (placement ? placement[t] : m->tensors[t].off);
}

/* The taps k of a kernel axis that land inside the input: lo <= k < hi, for
 * position o0 + k * d with o0 = out * stride - pad. */
static void valid_taps(int32_t o0, int32_t d, int32_t k, int32_t size, int32_t *lo,
                       int32_t *hi) {
    int32_t a = o0 < 0 ? (-o0 + d - 1) / d : 0;
    int32_t b = size - o0 <= 0 ? 0 : (size - o0 + d - 1) / d;
    *lo = a;
    *hi = b < k ? b : k;
}

/* QConv2d / QLinear, direct loops (a linear layer is a 1x1 convolution on a 1x1 map): the
 * kernel of the layers the fast kernels below do not cover (grouped or dilated ones). Output elements are
 * produced in (n, c, h, w) order, the order of the node perturbation's XORShift32 stream.
 * Padding taps are skipped (they hold the zero point, so they add nothing). The sum of a
 * position's |w (x - z_x)| <= 128 * 255 terms fits int32 when the reduction has at most
 * BPF_MAX_REDUCTION of them, which the exporter checks. */
static KERNEL void affine_reference(const bpf_affine *p, const bpf_tensor *ti,
                                    const bpf_tensor *to, const int8_t *x, int8_t *y,
                                    int32_t batch) {
    uint32_t s = p->np_seed;
    int32_t cin_g = p->cin / p->groups, cout_g = p->cout / p->groups;
    int32_t taps = p->kh * p->kw, red = cin_g * taps;
    int32_t ihw = ti->h * ti->w, zp = p->in_zp;
    int pointwise = taps == 1 && p->sh == 1 && p->sw == 1 && p->ph == 0 && p->pw == 0 &&
                    ti->h == to->h && ti->w == to->w;
    for (int32_t n = 0; n < batch; n++) {
        const int8_t *xn = x + (int64_t)n * ti->numel;
        int8_t *yn = y + (int64_t)n * to->numel;
        for (int32_t co = 0; co < p->cout; co++) {
            const int8_t *wc = p->w + (int64_t)co * red;
            const int8_t *xg = xn + (int64_t)(co / cout_g) * cin_g * ihw;
            int8_t *yc = yn + (int64_t)co * to->h * to->w;
            for (int32_t oh = 0; oh < to->h; oh++) {
                int32_t ih0 = oh * p->sh - p->ph, ilo, ihi;
                valid_taps(ih0, p->dh, p->kh, ti->h, &ilo, &ihi);
                for (int32_t ow = 0; ow < to->w; ow++) {
                    int32_t acc = 0;
                    if (pointwise) {
                        const int8_t *xp = xg + oh * ti->w + ow;
                        for (int32_t ci = 0; ci < cin_g; ci++)
                            acc += (int32_t)wc[ci] * ((int32_t)xp[(int64_t)ci * ihw] - zp);
                    } else {
                        int32_t iw0 = ow * p->sw - p->pw, jlo, jhi;
                        valid_taps(iw0, p->dw, p->kw, ti->w, &jlo, &jhi);
                        for (int32_t ci = 0; ci < cin_g; ci++) {
                            const int8_t *xc = xg + (int64_t)ci * ihw;
                            const int8_t *wk = wc + ci * taps;
                            for (int32_t i = ilo; i < ihi; i++) {
                                const int8_t *row = xc + (ih0 + i * p->dh) * ti->w + iw0;
                                const int8_t *wr = wk + i * p->kw;
                                for (int32_t j = jlo; j < jhi; j++)
                                    acc += (int32_t)wr[j] * ((int32_t)row[j * p->dw] - zp);
                            }
                        }
                    }
                    int64_t v = bpf_sat32((int64_t)acc + p->b[co]);
                    int64_t z = bpf_mbqm(v, p->mult[co], p->shift[co]) + p->out_zp;
                    z = bpf_clamp(z, -128, 127);
                    if (p->np_seed) {
                        s = xorshift32(s);
                        z += RADEMACHER(s);
                    }
                    yc[oh * to->w + ow] = (int8_t)bpf_clamp(z, p->qmin, p->qmax);
                }
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------
 * Fast int8 kernels, in the style of CMSIS-NN (written here, same arithmetic as the loops
 * above): convolutions and fully connected layers as an int16 im2col block times the int8
 * weights, two output channels by two columns at a time (arm_nn_mat_mult_kernel_s8_s16), and
 * depthwise convolutions over a ring of zero-padded int16 input rows. On a core with the DSP
 * extension (Cortex-M4/M7: __ARM_FEATURE_DSP) the products are dual 16-bit MACs (SMLAD, via
 * GCC's ACLE intrinsics); elsewhere the inner loops are plain C that a compiler vectorizes.
 * Products and sums are the same integers as in affine_reference, so the outputs are equal
 * bit for bit. */
/* The kernels are integer-only: on the host, GCC compiles them at -O3 whatever the build's
 * level, so the loops over the reduction vectorize (the generated Makefile and run_c build
 * with -O2, whose vectorizer takes only loops of known trip counts). */
#if !BPF_DSP && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("O3")
#define BPF_KERNELS_O3 1
#endif

/* The most taps of a depthwise kernel the fast path takes (7x7 = 49; larger use the loops). */
#define BPF_DW_MAX_TAPS 64

static inline uint32_t read_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v); /* one (unaligned) LDR on the M7 */
    return v;
}

#if BPF_DSP
/* SXTB16 of x rotated right by 8 bits, one instruction (GCC 12's arm_acle.h has no __ror,
 * and GCC does not fold a rotate into SXTB16). */
static inline int32_t sxtb16_ror8(uint32_t x) {
    int32_t r;
    __asm__("sxtb16 %0, %1, ror #8" : "=r"(r) : "r"(x));
    return r;
}
#endif

/* An output channel's requantization (affine_reference's, up to the clamp to [lo, hi]). */
typedef struct {
    bpf_requant k;       /* the reference form's constants (RQ_ANY) */
    bpf_rq_smmlar f;     /* the one-SMMLAR form (RQ_FAST, RQ_FULL, RQ_POST) */
    int32_t bias, zp;
    int32_t post_ok; /* the bias can start the accumulator, |acc| < 2^30 whatever the input,
                      * and f applies: RQ_POST */
    int32_t fast;    /* ... and f holds the zero point (f.post == 0): RQ_FAST, RQ_FULL */
} requant_ch;

/* `red`: the products per output (each |w (x - z_x)| <= 128 * 255). */
static inline requant_ch requant_channel(const bpf_affine *p, int32_t co, int32_t red) {
    requant_ch q;
    q.k = bpf_requant_of(p->mult[co], p->shift[co]);
    q.f = bpf_rq_smmlar_of(p->mult[co], p->shift[co], p->out_zp);
    q.bias = p->b[co];
    q.zp = p->out_zp;
    q.post_ok = q.f.ok && (q.bias < 0 ? -(int64_t)q.bias : (int64_t)q.bias) +
                                  (int64_t)red * 32640 < ((int64_t)1 << 30);
    q.fast = q.post_ok && q.f.post == 0;
    return q;
}

static inline int32_t clamp_to(int32_t z, int32_t lo, int32_t hi) {
    z = z < lo ? lo : z;
    return z > hi ? hi : z;
}

/* clamp(mbqm(sat32(acc + bias)) + zp, -128, 127), then to [lo, hi] (within [-128, 127]).
 * `mode` (a constant where it is inlined): RQ_ANY, or the caller's promise that q->fast and
 * that the accumulator started at the bias (RQ_FAST), and also that [lo, hi] is [-128, 127]
 * (RQ_FULL, one SSAT); RQ_POST: as RQ_FULL with q->post_ok only (the zero point added after
 * the shift). On the fast paths |acc| < 2^30 (no saturation) and bpf_mbqm_zp gives
 * mbqm + zp (- post), which [lo, hi] then clamps. */
enum { RQ_ANY = 0, RQ_FAST = 1, RQ_FULL = 2, RQ_POST = 3 };
static inline __attribute__((always_inline)) int8_t requantize(const requant_ch *q, int32_t acc,
                                                               int32_t lo, int32_t hi,
                                                               int mode) {
    if (mode == RQ_ANY) {
        int32_t z = bpf_clamp(bpf_mbqm(bpf_sat_add(acc, q->bias), q->k.mult, q->k.shift) + q->zp,
                              -128, 127);
        return (int8_t)clamp_to(z, lo, hi);
    }
    int32_t z = bpf_mbqm_zp(&q->f, acc);
    if (mode == RQ_FAST) return (int8_t)clamp_to(z, lo, hi);
    if (mode == RQ_POST) z += q->f.post;
#if BPF_DSP
    return (int8_t)__ssat(z, 8);
#else
    return (int8_t)clamp_to(z, -128, 127);
#endif
}

/* The requantization mode of a channel (pair) clamped to [lo, hi]; the accumulators start
 * at acc_init(q, mode). */
static inline int32_t acc_init(const requant_ch *q, int mode) { return mode ? q->bias : 0; }

static inline int rq_mode(const requant_ch *a, const requant_ch *b, int32_t lo, int32_t hi) {
    if (!a->fast || !b->fast) return RQ_ANY;
    return lo == -128 && hi == 127 ? RQ_FULL : RQ_FAST;
}

/* Node perturbation (Eq. 9) after a fast kernel: the kernels clamp to [-128, 127] only, and
 * this pass adds the Rademacher signs in output order (n, c, h, w), the order of the
 * XORShift32 stream, then clamps to [qmin, qmax], as affine_reference does per output. */
static void perturb_nodes(const bpf_affine *p, int8_t *y, int64_t count) {
    uint32_t s = p->np_seed;
    for (int64_t i = 0; i < count; i++) {
        s = xorshift32(s);
        y[i] = (int8_t)bpf_clamp((int64_t)y[i] + RADEMACHER(s), p->qmin, p->qmax);
    }
}

/* The im2col block holds its columns in pairs (the last column of an odd block is paired
 * with a copy of itself). On DSP builds a pair is interleaved by groups of 4 reduction
 * entries, [c0: k..k+3][c1: k..k+3] ..., then entry by entry for the last red mod 4, and
 * each group is stored in the order (0, 2, 1, 3): SXTB16 of 4 weights gives entries 0 and
 * 2, of them rotated by 8 entries 1 and 3, each meeting one 32-bit word of the column
 * (CMSIS-NN's read_and_pad_reordered); one pointer then walks both columns. Elsewhere the
 * two columns lie one after the other, for loops a compiler vectorizes. */
static inline int32_t col_slot(int32_t k, int32_t c, int32_t red) {
#if BPF_DSP
    int32_t full = red & ~3;
    if (k < full) return (k & ~3) * 2 + c * 4 + ((k & 1) << 1) + ((k >> 1) & 1);
    return full * 2 + (k - full) * 2 + c;
#else
    return c * red + k;
#endif
}

static int is_pointwise(const bpf_affine *p) {
    return p->kh * p->kw == 1 && p->sh == 1 && p->sw == 1 && p->ph == 0 && p->pw == 0;
}

/* The column of output position `pos` of a (non-pointwise) convolution in weight order
 * (ci, i, j): (x - z_x) as int16, 0 at padding taps. */
static void conv_column(const bpf_affine *p, const bpf_tensor *ti, const int8_t *xn,
                        int32_t oh, int32_t ow, int16_t *t) {
    int32_t ih0 = oh * p->sh - p->ph, iw0 = ow * p->sw - p->pw, zp = p->in_zp;
    int32_t W = ti->w, kw = p->kw, dw = p->dw;
    int inner = iw0 >= 0 && iw0 + (kw - 1) * dw < W;
    for (int32_t ci = 0; ci < p->cin; ci++) {
        const int8_t *xc = xn + (int64_t)ci * ti->h * W;
        for (int32_t i = 0; i < p->kh; i++) {
            int32_t ih = ih0 + i * p->dh;
            if (ih < 0 || ih >= ti->h) {
                for (int32_t j = 0; j < kw; j++) *t++ = 0;
                continue;
            }
            const int8_t *xr = xc + (int64_t)ih * W + iw0;
            if (inner)
                for (int32_t j = 0; j < kw; j++) *t++ = (int16_t)(xr[j * dw] - zp);
            else
                for (int32_t j = 0; j < kw; j++) {
                    int32_t iw = iw0 + j * dw;
                    *t++ = (int16_t)(iw >= 0 && iw < W ? xr[j * dw] - zp : 0);
                }
        }
    }
}

/* im2col: the column of output position `pos` of one sample, as entry c of the pair at
 * `pair` (`tmp`: room for one column, used by DSP builds of non-pointwise layers). */
static void im2col(const bpf_affine *p, const bpf_tensor *ti, const bpf_tensor *to,
                   const int8_t *xn, int32_t pos, int32_t red, int16_t *pair, int32_t c,
                   int16_t *tmp) {
    int32_t ihw = ti->h * ti->w, zp = p->in_zp, k = 0;
#if BPF_DSP
    int16_t *g = pair + c * 4;
    int32_t full = red & ~3;
#endif
    if (is_pointwise(p)) {
        const int8_t *xp = xn + pos;
#if BPF_DSP
        for (; k < full; k += 4, g += 8) {
            g[0] = (int16_t)(xp[(int64_t)k * ihw] - zp);
            g[2] = (int16_t)(xp[(int64_t)(k + 1) * ihw] - zp);
            g[1] = (int16_t)(xp[(int64_t)(k + 2) * ihw] - zp);
            g[3] = (int16_t)(xp[(int64_t)(k + 3) * ihw] - zp);
        }
#endif
        for (; k < red; k++) pair[col_slot(k, c, red)] = (int16_t)(xp[(int64_t)k * ihw] - zp);
        return;
    }
#if BPF_DSP
    conv_column(p, ti, xn, pos / to->w, pos % to->w, tmp);
    for (; k < full; k += 4, g += 8) {
        g[0] = tmp[k];
        g[2] = tmp[k + 1];
        g[1] = tmp[k + 2];
        g[3] = tmp[k + 3];
    }
    for (; k < red; k++) pair[col_slot(k, c, red)] = tmp[k];
#else
    (void)tmp;
    (void)k;
    conv_column(p, ti, xn, pos / to->w, pos % to->w, pair + (int64_t)c * red);
#endif
}

/* a = init + {w0.c0, w0.c1, w1.c0, w1.c1}: weight rows w0 and w0 + red by the column pair
 * (init0 for row w0, init1 for row w0 + red). */
static inline void dot_2x2(const int8_t *w0, const int16_t *pair, int32_t red, int32_t *a,
                           int32_t init0, int32_t init1) {
    int32_t a00 = init0, a01 = init0, a10 = init1, a11 = init1, k = 0;
#if BPF_DSP
    const int16_t *g = pair;
    for (int32_t full = red & ~3; k < full; k += 4, g += 8) {
        uint32_t wa = read_u32(w0 + k);
        int32_t x02 = (int32_t)read_u32(g), x13 = (int32_t)read_u32(g + 2);
        int32_t y02 = (int32_t)read_u32(g + 4), y13 = (int32_t)read_u32(g + 6);
        int32_t w02 = (int32_t)__sxtb16(wa), w13 = sxtb16_ror8(wa);
        a00 = __smlad(w02, x02, a00);
        a00 = __smlad(w13, x13, a00);
        a01 = __smlad(w02, y02, a01);
        a01 = __smlad(w13, y13, a01);
        uint32_t wb = read_u32(w0 + red + k);
        w02 = (int32_t)__sxtb16(wb);
        w13 = sxtb16_ror8(wb);
        a10 = __smlad(w02, x02, a10);
        a10 = __smlad(w13, x13, a10);
        a11 = __smlad(w02, y02, a11);
        a11 = __smlad(w13, y13, a11);
    }
    for (; k < red; k++, g += 2) {
        int32_t u = w0[k], v = w0[red + k];
        a00 += u * g[0];
        a01 += u * g[1];
        a10 += v * g[0];
        a11 += v * g[1];
    }
#else
    const int16_t *c0 = pair, *c1 = pair + red;
    const int8_t *w1 = w0 + red;
    for (; k < red; k++) {
        int32_t u = w0[k], v = w1[k];
        a00 += u * c0[k];
        a01 += u * c1[k];
        a10 += v * c0[k];
        a11 += v * c1[k];
    }
#endif
    a[0] = a00;
    a[1] = a01;
    a[2] = a10;
    a[3] = a11;
}

/* Two output channels (rows w0, w0 + red; outputs y0, y1) over an im2col block of nb
 * columns. Kept out of line, so that its registers are the inner loop's; `mode` is a
 * constant in each of its two instances. */
static inline __attribute__((always_inline)) void gemm_rows_impl(
    const int8_t *w0, const int16_t *cols, int32_t red, int32_t nb, const requant_ch *q0,
    const requant_ch *q1, int8_t *y0, int8_t *y1, int32_t lo, int32_t hi, int mode) {
    requant_ch r0 = *q0, r1 = *q1;
    for (int32_t j = 0; j < nb; j += 2) {
        int32_t a[4];
        dot_2x2(w0, cols + (int64_t)j * red, red, a, acc_init(&r0, mode), acc_init(&r1, mode));
        y0[j] = requantize(&r0, a[0], lo, hi, mode);
        y1[j] = requantize(&r1, a[2], lo, hi, mode);
        if (j + 1 < nb) {
            y0[j + 1] = requantize(&r0, a[1], lo, hi, mode);
            y1[j + 1] = requantize(&r1, a[3], lo, hi, mode);
        }
    }
}

#define GEMM_ROWS(NAME, MODE)                                                                 \
    static __attribute__((noinline)) void NAME(const int8_t *w0, const int16_t *cols,         \
                                                int32_t red, int32_t nb, const requant_ch *q0,  \
                                                const requant_ch *q1, int8_t *y0, int8_t *y1,  \
                                                int32_t lo, int32_t hi) {                      \
        gemm_rows_impl(w0, cols, red, nb, q0, q1, y0, y1, lo, hi, MODE);                       \
    }
GEMM_ROWS(gemm_rows_any, RQ_ANY)
GEMM_ROWS(gemm_rows_fast, RQ_FAST)
GEMM_ROWS(gemm_rows_full, RQ_FULL)

/* Convolution (groups 1, incl. pointwise) and fully connected: per sample, blocks of output
 * positions are unrolled into `scratch` (as many column pairs as fit, at least one), then
 * every pair of output channels runs over the block two columns at a time. With an odd
 * output channel count (>= 2) the last pair is (cout - 2, cout - 1): one row is computed
 * twice, to the same values. */
static KERNEL void affine_gemm(const bpf_affine *p, const bpf_tensor *ti,
                               const bpf_tensor *to, const int8_t *x, int8_t *y, int32_t batch,
                               int16_t *scratch, int32_t scratch_elems, int32_t lo,
                               int32_t hi) {
    int32_t red = p->cin * p->kh * p->kw, P = to->h * to->w;
    int32_t room = is_pointwise(p) ? scratch_elems : scratch_elems - red; /* tmp at the end */
    int16_t *tmp = scratch + room;
    int32_t block = room / (2 * red) * 2;
    if (block > P) block = P;
    for (int32_t n = 0; n < batch; n++) {
        const int8_t *xn = x + (int64_t)n * ti->numel;
        int8_t *yn = y + (int64_t)n * to->numel;
        for (int32_t p0 = 0; p0 < P; p0 += block) {
            int32_t nb = P - p0 < block ? P - p0 : block;
            for (int32_t j = 0; j < nb; j++)
                im2col(p, ti, to, xn, p0 + j, red, scratch + (int64_t)(j & ~1) * red, j & 1, tmp);
            if (nb & 1)
                im2col(p, ti, to, xn, p0 + nb - 1, red, scratch + (int64_t)(nb - 1) * red, 1,
                       tmp);
            for (int32_t co = 0; co < p->cout; co += 2) {
                int32_t c0 = co + 1 < p->cout ? co : co - 1; /* odd count: redo co - 1 */
                requant_ch q0 = requant_channel(p, c0, red), q1 = requant_channel(p, c0 + 1, red);
                static void (*const rows[3])(const int8_t *, const int16_t *, int32_t, int32_t,
                                             const requant_ch *, const requant_ch *, int8_t *,
                                             int8_t *, int32_t, int32_t) = {
                    gemm_rows_any, gemm_rows_fast, gemm_rows_full};
                rows[rq_mode(&q0, &q1, lo, hi)](
                          p->w + (int64_t)c0 * red, scratch, red, nb, &q0, &q1,
                          yn + (int64_t)c0 * P + p0, yn + (int64_t)(c0 + 1) * P + p0, lo, hi);
            }
        }
    }
}

/* Depthwise convolution (dilation 1, at most BPF_DW_MAX_TAPS taps): per channel, input rows
 * are converted once into a ring of kh zero-padded int16 rows (slot ih mod kh; a last row of
 * zeros stands for the padding rows), so every output is kh runs of kw taps over contiguous
 * int16. The weights are copied per channel as int16 rows padded to an even length with a
 * zero, so each row is a run of tap pairs (SMLAD); the ring's rows are one entry longer
 * than the padded input, for the pad tap of the last output (times 0). Square 3x3, 5x5 and
 * 7x7 kernels get unrolled loops. */
#define DW_ROW_STRIDE(w) (((w) + 2) & ~1)

/* One output row: outputs ow = 0 .. count-1 at input column ow * sw of the kh rows, two
 * outputs at a time (each weight pair is loaded once for both). Instances with the kernel
 * shape and stride as constants unroll fully; each has a fast-requantization form, and one
 * general instance takes any shape and requantization. */
#define DW_PAIR(acc, w, r) acc = dw_pair(w, r, acc)
static inline int32_t dw_pair(const int16_t *w, const int16_t *r, int32_t acc) {
#if BPF_DSP
    return __smlad((int32_t)read_u32(w), (int32_t)read_u32(r), acc);
#else
    return acc + w[0] * r[0] + w[1] * r[1];
#endif
}
#define DW_OUTPUT_ROW(NAME, KH, KWP, SW, FAST)                                                \
    static __attribute__((noinline)) void NAME(const int16_t *const *rows, int32_t kh,        \
                                                int32_t kwp, const int16_t *wk, int32_t count, \
                                                int32_t sw, int8_t *y, const requant_ch *q,   \
                                                int32_t lo, int32_t hi) {                     \
        (void)kh;                                                                             \
        (void)kwp;                                                                            \
        (void)sw;                                                                             \
        requant_ch r = *q;                                                                    \
        int32_t ow = 0;                                                                       \
        for (; ow + 2 <= count; ow += 2) {                                                    \
            int32_t acc0 = acc_init(&r, FAST), acc1 = acc0, base = ow * (SW);                 \
            _Pragma("GCC unroll 8") for (int32_t i = 0; i < (KH); i++) {                      \
                const int16_t *x0 = rows[i] + base, *w = wk + i * (KWP);                      \
                _Pragma("GCC unroll 4") for (int32_t j = 0; j < (KWP); j += 2) {              \
                    DW_PAIR(acc0, w + j, x0 + j);                                             \
                    DW_PAIR(acc1, w + j, x0 + (SW) + j);                                      \
                }                                                                             \
            }                                                                                 \
            y[ow] = requantize(&r, acc0, lo, hi, FAST);                                       \
            y[ow + 1] = requantize(&r, acc1, lo, hi, FAST);                                   \
        }                                                                                     \
        if (ow < count) {                                                                     \
            int32_t acc = acc_init(&r, FAST), base = ow * (SW);                               \
            for (int32_t i = 0; i < (KH); i++)                                                \
                for (int32_t j = 0; j < (KWP); j += 2)                                        \
                    DW_PAIR(acc, wk + i * (KWP) + j, rows[i] + base + j);                     \
            y[ow] = requantize(&r, acc, lo, hi, FAST);                                        \
        }                                                                                     \
    }
DW_OUTPUT_ROW(dw_row_3x3s1, 3, 4, 1, RQ_FULL)
DW_OUTPUT_ROW(dw_row_3x3s2, 3, 4, 2, RQ_FULL)
DW_OUTPUT_ROW(dw_row_5x5s1, 5, 6, 1, RQ_FULL)
DW_OUTPUT_ROW(dw_row_5x5s2, 5, 6, 2, RQ_FULL)
DW_OUTPUT_ROW(dw_row_7x7s1, 7, 8, 1, RQ_FULL)
DW_OUTPUT_ROW(dw_row_7x7s2, 7, 8, 2, RQ_FULL)
DW_OUTPUT_ROW(dw_row_full, kh, kwp, sw, RQ_FULL)
DW_OUTPUT_ROW(dw_row_fast, kh, kwp, sw, RQ_FAST)
DW_OUTPUT_ROW(dw_row_any, kh, kwp, sw, RQ_ANY)

#if BPF_DSP
/* Depthwise 3x3 / 5x5 / 7x7, stride 1 or 2, on the DSP over raw int8 rows: the input zero
 * point is folded into the accumulator's start, bias - z_x sum(w), and the padding holds z_x
 * (so a padding tap adds w z_x - w z_x = 0), which gives the same integer sum as
 * affine_reference. A word of four inputs x0..x3 gives, by SXTB16 and SXTB16 ror 8, the
 * pairs E = (x0, x2) and O = (x1, x3); the weights of a kernel row are paired with a gap of
 * two, (w0, w2), (w1, w3), (w4, w6), and the odd one out (w1 of 3, w4 of 5, w5 of 7) meets a
 * half of an E or O (SMLABB / SMLABT). With stride 1 two neighbouring outputs share every
 * word (output k + 1 takes O where output k takes E). `wt` holds the paired weights of each
 * kernel row: DW8_SLOTS(K) words. Rows live in a ring of K int8 rows of `rs` bytes (slot
 * ih mod K) plus a row of z_x for the padding rows; each row has z_x around the input and 4
 * bytes of slack, since a word may reach past the last tap. */
#define DW8_SLOTS(K) ((K) == 3 ? 2 : (K) == 5 ? 3 : 4)
#define SMLAD_(w, x, a) a = __smlad((w), (x), (a))
static inline __attribute__((always_inline)) void dw8_s1_row(int K, const int8_t *x,
                                                             const int32_t *w, int32_t *a0,
                                                             int32_t *a1) {
    uint32_t X0 = read_u32(x);
    int32_t E0 = (int32_t)__sxtb16(X0), O0 = sxtb16_ror8(X0);
    int32_t s0 = *a0, s1 = *a1;
    SMLAD_(w[0], E0, s0);
    SMLAD_(w[0], O0, s1);
    if (K == 3) {
        s0 = __smlabb(w[1], O0, s0);
        s1 = __smlabt(w[1], E0, s1);
    } else {
        uint32_t X2 = read_u32(x + 2);
        int32_t E2 = (int32_t)__sxtb16(X2);
        SMLAD_(w[1], O0, s0);
        SMLAD_(w[1], E2, s1);
        if (K == 5) {
            int32_t O2 = sxtb16_ror8(X2);
            s0 = __smlabt(w[2], E2, s0);
            s1 = __smlabt(w[2], O2, s1);
        } else {
            uint32_t X4 = read_u32(x + 4);
            int32_t E4 = (int32_t)__sxtb16(X4), O4 = sxtb16_ror8(X4);
            SMLAD_(w[2], E4, s0);
            SMLAD_(w[2], O4, s1);
            s0 = __smlabb(w[3], O4, s0);
            s1 = __smlabt(w[3], E4, s1);
        }
    }
    *a0 = s0;
    *a1 = s1;
}

/* One output whose taps start at x (any stride). */
static inline __attribute__((always_inline)) int32_t dw8_one_row(int K, const int8_t *x,
                                                                 const int32_t *w, int32_t a) {
    uint32_t X0 = read_u32(x);
    int32_t E0 = (int32_t)__sxtb16(X0), O0 = sxtb16_ror8(X0);
    SMLAD_(w[0], E0, a);
    if (K == 3) return __smlabb(w[1], O0, a);
    SMLAD_(w[1], O0, a);
    uint32_t X4 = read_u32(x + 4);
    int32_t E4 = (int32_t)__sxtb16(X4);
    if (K == 5) return __smlabb(w[2], E4, a);
    SMLAD_(w[2], E4, a);
    return __smlabb(w[3], sxtb16_ror8(X4), a);
}

/* Input row ih of a channel into a ring slot: z_x, the row, z_x up to rs bytes. */
static void dw8_fill_row(int8_t *r, const int8_t *xr, int32_t W, int32_t pw, int32_t rs,
                         int8_t zp) {
    int32_t j = 0;
    for (; j < pw; j++) r[j] = zp;
    if (W >= 32) {
        memcpy(r + pw, xr, (size_t)W);
        j += W;
    } else
        for (int32_t i = 0; i < W; i++, j++) r[j] = xr[i];
    for (; j < rs; j++) r[j] = zp;
}

/* The padded plane of a channel, (rows x rs bytes, z_x around the input), when it fits in
 * `room` bytes (small maps: no ring to keep, every row at a fixed offset); returns 0 when it
 * does not. */
static int dw8_plane(int8_t *plane, int32_t rows, int32_t room, const int8_t *xc, int32_t H,
                     int32_t W, int32_t ph, int32_t pw, int32_t rs, int8_t zp) {
    if (rows * rs > room) return 0;
    memset(plane, zp, (size_t)(rows * rs));
    for (int32_t ih = 0; ih < H; ih++) {
        int8_t *r = plane + (ih + ph) * rs + pw;
        const int8_t *xr = xc + ih * W;
        if (W >= 32) memcpy(r, xr, (size_t)W);
        else {
            int32_t j = 0;
            for (; j + 4 <= W; j += 4) {
                uint32_t v = read_u32(xr + j);
                memcpy(r + j, &v, 4); /* one (unaligned) STR */
            }
            for (; j < W; j++) r[j] = xr[j];
        }
    }
    return 1;
}

#define DW8_CHANNEL(NAME, K, S)                                                                \
    static __attribute__((noinline)) void NAME(                                               \
        const int8_t *xc, const bpf_tensor *ti, const bpf_tensor *to, int32_t ph, int32_t pw,  \
        const int32_t *wt, int32_t start, const requant_ch *q, int8_t *yc, int8_t *ring,       \
        int32_t room, int32_t rs, int8_t zp) {                                                 \
        requant_ch r = *q;                                                                    \
        int32_t held[K], OW = to->w, OH = to->h;                                              \
        int32_t prows = (OH - 1) * (S) + (K), top = ti->h + 2 * ph;                           \
        const int8_t *rows[K];                                                                \
        int8_t *zero = ring + (K) * rs;                                                       \
        int plane = dw8_plane(ring, prows > top ? prows : top, room, xc, ti->h, ti->w, ph, pw, \
                              rs, zp);                                                        \
        if (!plane) {                                                                         \
            for (int32_t j = 0; j < rs; j++) zero[j] = zp;                                    \
            for (int32_t i = 0; i < (K); i++) held[i] = -1;                                   \
        }                                                                                     \
        for (int32_t oh = 0; oh < OH; oh++) {                                                 \
            for (int32_t i = 0; i < (K); i++) {                                               \
                int32_t ih = oh * (S) - ph + i;                                               \
                if (plane) {                                                                  \
                    rows[i] = ring + (ih + ph) * rs;                                          \
                    continue;                                                                 \
                }                                                                             \
                if (ih < 0 || ih >= ti->h) {                                                  \
                    rows[i] = zero;                                                           \
                    continue;                                                                 \
                }                                                                             \
                int32_t slot = ih % (K);                                                      \
                int8_t *row = ring + slot * rs;                                               \
                if (held[slot] != ih) {                                                       \
                    dw8_fill_row(row, xc + ih * ti->w, ti->w, pw, rs, zp);                    \
                    held[slot] = ih;                                                          \
                }                                                                             \
                rows[i] = row;                                                                \
            }                                                                                 \
            int8_t *y = yc + oh * OW;                                                         \
            int32_t ow = 0;                                                                   \
            if ((S) == 1)                                                                     \
                for (; ow + 2 <= OW; ow += 2) {                                               \
                    int32_t a0 = start, a1 = start;                                           \
                    _Pragma("GCC unroll 8") for (int32_t i = 0; i < (K); i++)                 \
                        dw8_s1_row(K, rows[i] + ow, wt + i * DW8_SLOTS(K), &a0, &a1);         \
                    y[ow] = requantize(&r, a0, -128, 127, RQ_FULL);                           \
                    y[ow + 1] = requantize(&r, a1, -128, 127, RQ_FULL);                       \
                }                                                                             \
            for (; ow < OW; ow++) {                                                           \
                int32_t a = start;                                                            \
                _Pragma("GCC unroll 8") for (int32_t i = 0; i < (K); i++)                     \
                    a = dw8_one_row(K, rows[i] + ow * (S), wt + i * DW8_SLOTS(K), a);        \
                y[ow] = requantize(&r, a, -128, 127, RQ_FULL);                                \
            }                                                                                 \
        }                                                                                     \
    }
/* One instance per kernel shape the int8-row kernels take (square 3, 5, 7; stride 1, 2). */
#define DW8_SHAPES(X, P)                                                                       \
    X(P##_3x3s1, 3, 1) X(P##_3x3s2, 3, 2) X(P##_5x5s1, 5, 1) X(P##_5x5s2, 5, 2)                \
    X(P##_7x7s1, 7, 1) X(P##_7x7s2, 7, 2)
DW8_SHAPES(DW8_CHANNEL, dw8)
typedef void (*dw8_fn)(const int8_t *, const bpf_tensor *, const bpf_tensor *, int32_t,
                       int32_t, const int32_t *, int32_t, const requant_ch *, int8_t *,
                       int8_t *, int32_t, int32_t, int8_t);

static inline int32_t pack16(int32_t lo, int32_t hi) {
    return (int32_t)((uint32_t)(uint16_t)lo | ((uint32_t)hi << 16));
}

/* A convolution (groups 1) with few input channels, 3x3 / 5x5 / 7x7, stride 1 or 2 (MCUNet-in1's
 * first layer): the depthwise rows above, summed over the input channels, from a ring of
 * K int8 rows per input channel (the zero point folded into the accumulator's start, as
 * there); per output row, every output channel in turn. No im2col. */
#define CONV8_MAX_ROWS 32
static int32_t dw8_weights(const int8_t *w, int32_t K, int32_t *wt);
/* One output row of one output channel from the n = cin K rows; RQ_POST starts at the bias,
 * RQ_ANY adds it at the requantization (saturating, as the reference does). */
static inline __attribute__((always_inline)) void conv8_row(
    int K, int S, const int8_t *const *rows, int32_t n, const int32_t *wt, int32_t start,
    const requant_ch *q, int8_t *y, int32_t OW, int mode) {
    int32_t ow = 0;
    if (S == 1)
        for (; ow + 2 <= OW; ow += 2) {
            int32_t a0 = start, a1 = start;
            for (int32_t r = 0; r < n; r++)
                dw8_s1_row(K, rows[r] + ow, wt + r * DW8_SLOTS(K), &a0, &a1);
            y[ow] = requantize(q, a0, -128, 127, mode);
            y[ow + 1] = requantize(q, a1, -128, 127, mode);
        }
    for (; ow < OW; ow++) {
        int32_t a = start;
        for (int32_t r = 0; r < n; r++)
            a = dw8_one_row(K, rows[r] + ow * S, wt + r * DW8_SLOTS(K), a);
        y[ow] = requantize(q, a, -128, 127, mode);
    }
}

/* Four output channels at once (one output each): the words and pairs of a row are formed
 * once for the four (wt4: per row, the four channels' DW8_SLOTS(K) words); a channel off
 * the fast requantization (start without its bias) takes RQ_ANY. */
static inline __attribute__((always_inline)) void conv8_row4(
    int K, int S, const int8_t *const *rows, int32_t n, const int32_t *wt4, const int32_t *start,
    const requant_ch *q, int8_t *y, int32_t plane, int32_t OW) {
    const int32_t ns = DW8_SLOTS(K);
    for (int32_t ow = 0; ow < OW; ow++) {
        int32_t a0 = start[0], a1 = start[1], a2 = start[2], a3 = start[3];
        const int32_t *w = wt4;
        for (int32_t r = 0; r < n; r++, w += 4 * ns) {
            const int8_t *x = rows[r] + ow * S;
            uint32_t X0 = read_u32(x);
            int32_t E0 = (int32_t)__sxtb16(X0), O0 = sxtb16_ror8(X0), E4 = 0, O4 = 0;
            if (K > 3) {
                uint32_t X4 = read_u32(x + 4);
                E4 = (int32_t)__sxtb16(X4);
                if (K == 7) O4 = sxtb16_ror8(X4);
            }
#define CONV8_MAC(a, c)                                                                        \
    SMLAD_(w[(c) * ns], E0, a);                                                               \
    if (K == 3) a = __smlabb(w[(c) * ns + 1], O0, a);                                         \
    else {                                                                                    \
        SMLAD_(w[(c) * ns + 1], O0, a);                                                       \
        if (K == 5) a = __smlabb(w[(c) * ns + 2], E4, a);                                     \
        else {                                                                                \
            SMLAD_(w[(c) * ns + 2], E4, a);                                                   \
            a = __smlabb(w[(c) * ns + 3], O4, a);                                             \
        }                                                                                     \
    }
            CONV8_MAC(a0, 0)
            CONV8_MAC(a1, 1)
            CONV8_MAC(a2, 2)
            CONV8_MAC(a3, 3)
#undef CONV8_MAC
        }
#define CONV8_OUT(c, a)                                                                        \
    y[(c) * plane + ow] = q[c].post_ok ? requantize(&q[c], a, -128, 127, RQ_POST)              \
                                       : requantize(&q[c], a, -128, 127, RQ_ANY);
        CONV8_OUT(0, a0)
        CONV8_OUT(1, a1)
        CONV8_OUT(2, a2)
        CONV8_OUT(3, a3)
#undef CONV8_OUT
    }
}

#define CONV8_ROWS(NAME, K, S)                                                                 \
    static __attribute__((noinline)) void NAME(const bpf_affine *p, const bpf_tensor *ti,      \
                                                const bpf_tensor *to, const int8_t *xn,         \
                                                int8_t *yn, int8_t *ring, int32_t rs) {         \
        int32_t cin = p->cin, OW = to->w, OH = to->h, taps = (K) * (K), n = cin * (K);        \
        int32_t held[CONV8_MAX_ROWS], wt[CONV8_MAX_ROWS * 4], wt4[CONV8_MAX_ROWS * 16];        \
        const int8_t *rows[CONV8_MAX_ROWS];                                                   \
        int8_t zp = (int8_t)p->in_zp, *zero = ring + n * rs;                                  \
        for (int32_t j = 0; j < rs; j++) zero[j] = zp;                                        \
        for (int32_t r = 0; r < n; r++) held[r] = -1;                                         \
        for (int32_t oh = 0; oh < OH; oh++) {                                                 \
            for (int32_t ci = 0; ci < cin; ci++)                                              \
                for (int32_t i = 0; i < (K); i++) {                                           \
                    int32_t ih = oh * (S) - p->ph + i, slot = ci * (K) + ih % (K);            \
                    if (ih < 0 || ih >= ti->h) {                                              \
                        rows[ci * (K) + i] = zero;                                            \
                        continue;                                                             \
                    }                                                                         \
                    if (held[slot] != ih) {                                                   \
                        dw8_fill_row(ring + slot * rs,                                        \
                                     xn + ((int64_t)ci * ti->h + ih) * ti->w, ti->w, p->pw,   \
                                     rs, zp);                                                 \
                        held[slot] = ih;                                                      \
                    }                                                                         \
                    rows[ci * (K) + i] = ring + slot * rs;                                    \
                }                                                                             \
            int32_t co = 0;                                                                   \
            for (; co + 4 <= p->cout; co += 4) {                                              \
                requant_ch q4[4];                                                             \
                int32_t start4[4];                                                            \
                for (int32_t c = 0; c < 4; c++) {                                             \
                    q4[c] = requant_channel(p, co + c, cin * taps);                           \
                    start4[c] = q4[c].post_ok ? q4[c].bias : 0;                               \
                    for (int32_t ci = 0; ci < cin; ci++) {                                    \
                        start4[c] -= p->in_zp * dw8_weights(                                  \
                            p->w + ((int64_t)(co + c) * cin + ci) * taps, K, wt);             \
                        for (int32_t i = 0; i < (K); i++)                                     \
                            for (int32_t k = 0; k < DW8_SLOTS(K); k++)                        \
                                wt4[(((ci * (K) + i) * 4) + c) * DW8_SLOTS(K) + k] =          \
                                    wt[i * DW8_SLOTS(K) + k];                                 \
                    }                                                                         \
                }                                                                             \
                conv8_row4(K, S, rows, n, wt4, start4, q4, yn + ((int64_t)co * OH + oh) * OW,  \
                           OH * OW, OW);                                                      \
            }                                                                                 \
            for (; co < p->cout; co++) {                                                      \
                requant_ch q = requant_channel(p, co, cin * taps);                            \
                int32_t start = 0;                                                            \
                for (int32_t ci = 0; ci < cin; ci++)                                          \
                    start -= p->in_zp * dw8_weights(p->w + ((int64_t)co * cin + ci) * taps,   \
                                                    K, wt + ci * (K) * DW8_SLOTS(K));         \
                int8_t *y = yn + ((int64_t)co * OH + oh) * OW;                                \
                if (q.post_ok)                                                                \
                    conv8_row(K, S, rows, n, wt, start + q.bias, &q, y, OW, RQ_POST);         \
                else                                                                          \
                    conv8_row(K, S, rows, n, wt, start, &q, y, OW, RQ_ANY);                   \
            }                                                                                 \
        }                                                                                     \
    }
DW8_SHAPES(CONV8_ROWS, conv8)
typedef void (*conv8_fn)(const bpf_affine *, const bpf_tensor *, const bpf_tensor *,
                         const int8_t *, int8_t *, int8_t *, int32_t);

/* The kernel of a layer, or NULL: square 3, 5 or 7, equal strides 1 or 2. */
static dw8_fn dw8_kernel(const bpf_affine *p) {
    static const dw8_fn fns[3][2] = {{dw8_3x3s1, dw8_3x3s2}, {dw8_5x5s1, dw8_5x5s2},
                                     {dw8_7x7s1, dw8_7x7s2}};
    int32_t k = p->kh;
    if (k != p->kw || p->sh != p->sw || (p->sh != 1 && p->sh != 2) ||
        (k != 3 && k != 5 && k != 7))
        return NULL;
    return fns[k / 2 - 1][p->sh - 1];
}

/* Channel c's weights paired as dw8_s1_row reads them; returns sum(w). */
static int32_t dw8_weights(const int8_t *w, int32_t K, int32_t *wt) {
    int32_t sum = 0, n = DW8_SLOTS(K);
    for (int32_t i = 0; i < K; i++, w += K, wt += n) {
        for (int32_t j = 0; j < K; j++) sum += w[j];
        wt[0] = pack16(w[0], w[2]);
        if (K == 3) wt[1] = pack16(w[1], 0);
        else {
            wt[1] = pack16(w[1], w[3]);
            if (K == 5) wt[2] = pack16(w[4], 0);
            else {
                wt[2] = pack16(w[4], w[6]);
                wt[3] = pack16(w[5], 0);
            }
        }
    }
    return sum;
}

/* The conv8 kernel of a layer and the bytes of one ring row, or NULL: groups 1, square 3, 5
 * or 7, equal strides 1 or 2, no dilation, cin K rows (and the z_x row) in the scratch,
 * clamped to [-128, 127], and every partial sum far from int32's bounds
 * (|bias - z_x sum(w)| + cin K^2 2^14 < 2^30, without the bias on channels that take
 * RQ_ANY). */
static conv8_fn conv8_kernel(const bpf_affine *p, const bpf_tensor *ti, int32_t scratch_elems,
                             int32_t lo, int32_t hi, int32_t *rs) {
    static const conv8_fn fns[3][2] = {{conv8_3x3s1, conv8_3x3s2}, {conv8_5x5s1, conv8_5x5s2},
                                       {conv8_7x7s1, conv8_7x7s2}};
    int32_t k = p->kh, red = p->cin * p->kh * p->kw;
    if (p->groups != 1 || k != p->kw || p->sh != p->sw || (p->sh != 1 && p->sh != 2) ||
        (k != 3 && k != 5 && k != 7) || p->dh != 1 || p->dw != 1 || lo != -128 || hi != 127 ||
        p->cin * k > CONV8_MAX_ROWS)
        return NULL;
    *rs = (ti->w + 2 * p->pw + 4 + 3) & ~3;
    if ((int64_t)(p->cin * k + 1) * *rs > 2 * (int64_t)scratch_elems) return NULL;
    for (int32_t co = 0; co < p->cout; co++) {
        requant_ch q = requant_channel(p, co, red);
        int64_t sum = 0;
        for (int32_t i = 0; i < red; i++) sum += p->w[(int64_t)co * red + i];
        int64_t start = (q.post_ok ? q.bias : 0) - (int64_t)p->in_zp * sum;
        if ((start < 0 ? -start : start) + (int64_t)red * 16384 >= ((int64_t)1 << 30))
            return NULL;
    }
    return fns[k / 2 - 1][p->sh - 1];
}
#endif

static void affine_depthwise(const bpf_affine *p, const bpf_tensor *ti, const bpf_tensor *to,
                             const int8_t *x, int8_t *y, int32_t batch, int16_t *scratch,
                             int32_t scratch_elems, int32_t lo, int32_t hi) {
    int32_t kh = p->kh, kw = p->kw, kwp = (kw + 1) & ~1, taps = kh * kw;
    int32_t W2 = ti->w + 2 * p->pw, RS = DW_ROW_STRIDE(W2);
    int32_t ihw = ti->h * ti->w, ohw = to->h * to->w, zp = p->in_zp;
    int32_t held[BPF_DW_MAX_TAPS];
    int16_t wk[2 * BPF_DW_MAX_TAPS];
    const int16_t *rows[BPF_DW_MAX_TAPS];
    void (*shaped)(const int16_t *const *, int32_t, int32_t, const int16_t *, int32_t, int32_t,
                   int8_t *, const requant_ch *, int32_t, int32_t) = dw_row_full;
    if (kh == kw && (p->sw == 1 || p->sw == 2) && (kh == 3 || kh == 5 || kh == 7)) {
        static void (*const shapes[3][2])(const int16_t *const *, int32_t, int32_t,
                                          const int16_t *, int32_t, int32_t, int8_t *,
                                          const requant_ch *, int32_t, int32_t) = {
            {dw_row_3x3s1, dw_row_3x3s2}, {dw_row_5x5s1, dw_row_5x5s2},
            {dw_row_7x7s1, dw_row_7x7s2}};
        shaped = shapes[kh / 2 - 1][p->sw - 1];
    }
    int16_t *zero = scratch + (int64_t)kh * RS;
#if BPF_DSP
    /* The int8 ring, (kh + 1) rs8 bytes with rs8 <= 2 RS, lies within the int16 one. */
    dw8_fn dw8 = dw8_kernel(p);
    int32_t wt[7 * 4], rs8 = (W2 + 4 + 3) & ~3;
#endif
    for (int32_t n = 0; n < batch; n++)
        for (int32_t c = 0; c < p->cout; c++) {
            const int8_t *xc = x + (int64_t)n * ti->numel + (int64_t)c * ihw;
            int8_t *yc = y + (int64_t)n * to->numel + (int64_t)c * ohw;
            requant_ch q = requant_channel(p, c, taps);
#if BPF_DSP
            if (dw8 && rq_mode(&q, &q, lo, hi) == RQ_FULL) {
                int64_t start = (int64_t)q.bias -
                                (int64_t)zp * dw8_weights(p->w + (int64_t)c * taps, kh, wt);
                /* every partial sum stays an int32 well inside the fast requantization's
                 * |acc| < 2^30 (each |w x| <= 2^14) */
                if ((start < 0 ? -start : start) + (int64_t)taps * 16384 < ((int64_t)1 << 30)) {
                    dw8(xc, ti, to, p->ph, p->pw, wt, (int32_t)start, &q, yc, (int8_t *)scratch,
                        2 * scratch_elems, rs8, (int8_t)zp);
                    continue;
                }
            }
#endif
            void (*row)(const int16_t *const *, int32_t, int32_t, const int16_t *, int32_t,
                        int32_t, int8_t *, const requant_ch *, int32_t, int32_t) = shaped;
            int mode = rq_mode(&q, &q, lo, hi);
            if (mode != RQ_FULL) row = mode == RQ_FAST ? dw_row_fast : dw_row_any;
            for (int32_t i = 0; i < RS; i++) zero[i] = 0; /* (the int8 ring may cover it) */
            for (int32_t i = 0; i < kh; i++) {
                for (int32_t j = 0; j < kwp; j++)
                    wk[i * kwp + j] = (int16_t)(j < kw ? p->w[(int64_t)c * taps + i * kw + j] : 0);
                held[i] = -1;
            }
            for (int32_t oh = 0; oh < to->h; oh++) {
                for (int32_t i = 0; i < kh; i++) {
                    int32_t ih = oh * p->sh - p->ph + i;
                    if (ih < 0 || ih >= ti->h) {
                        rows[i] = zero;
                        continue;
                    }
                    int16_t *r = scratch + (int64_t)(ih % kh) * RS;
                    if (held[ih % kh] != ih) {
                        const int8_t *xr = xc + (int64_t)ih * ti->w;
                        for (int32_t j = 0; j < p->pw; j++) r[j] = 0;
                        for (int32_t j = 0; j < ti->w; j++) r[p->pw + j] = (int16_t)(xr[j] - zp);
                        for (int32_t j = p->pw + ti->w; j < RS; j++) r[j] = 0;
                        held[ih % kh] = ih;
                    }
                    rows[i] = r;
                }
                row(rows, kh, kwp, wk, to->w, p->sw, yc + oh * to->w, &q, lo, hi);
            }
        }
}

static int depthwise_fast(const bpf_affine *p) {
    return p->groups == p->cin && p->groups == p->cout && p->dh == 1 && p->dw == 1 &&
           p->kh * p->kw <= BPF_DW_MAX_TAPS;
}

#ifdef BPF_KERNELS_O3
#pragma GCC pop_options
#endif

/* FloatRuleLinear (a .tflite's FULLY_CONNECTED): int64 sums of w (x - z_x), then the
 * float-scale epilogue in IEEE double, exact as bpfree.models.mcunet.float_rule computes it
 * (acc + bias is exact below 2^53; one rounded product; round or rint). */
static void linear_float_rule(const bpf_affine *p, const int8_t *x, int8_t *y, int32_t batch,
                              int32_t in_numel, int32_t out_numel, int32_t lo, int32_t hi) {
    for (int32_t n = 0; n < batch; n++) {
        const int8_t *xn = x + (int64_t)n * in_numel;
        for (int32_t co = 0; co < p->cout; co++) {
            const int8_t *wc = p->w + (int64_t)co * p->cin;
            int64_t acc = 0;
            for (int32_t k = 0; k < p->cin; k++) acc += (int64_t)wc[k] * (xn[k] - p->in_zp);
            double v = (double)(acc + p->b[co]) * p->eff[co];
            v = (p->rounding ? round(v) : rint(v)) + (double)p->out_zp;
            y[(int64_t)n * out_numel + co] = (int8_t)(v < lo ? lo : (v > hi ? hi : v));
        }
    }
}

/* QConv2d / QLinear: the fast kernels where they apply, else affine_reference. */
static void affine(const bpf_model *m, const bpf_affine *p, const bpf_tensor *ti,
                   const bpf_tensor *to, const int8_t *x, int8_t *y, int32_t batch) {
    int32_t lo = p->np_seed ? -128 : p->qmin, hi = p->np_seed ? 127 : p->qmax;
#if BPF_DSP
    int32_t rs;
    conv8_fn conv8 = m->scratch ? conv8_kernel(p, ti, m->scratch_elems, lo, hi, &rs) : NULL;
#endif
    if (p->eff)
        linear_float_rule(p, x, y, batch, (int32_t)ti->numel, (int32_t)to->numel, lo, hi);
#if BPF_DSP
    else if (conv8)
        for (int32_t n = 0; n < batch; n++)
            conv8(p, ti, to, x + (int64_t)n * ti->numel, y + (int64_t)n * to->numel,
                  (int8_t *)m->scratch, rs);
#endif
    else if (p->groups == 1 && p->cout >= 2 && m->scratch &&
        p->cin * p->kh * p->kw * (is_pointwise(p) ? 2 : 3) <= m->scratch_elems)
        affine_gemm(p, ti, to, x, y, batch, m->scratch, m->scratch_elems, lo, hi);
    else if (depthwise_fast(p) && m->scratch &&
             (p->kh + 1) * DW_ROW_STRIDE(ti->w + 2 * p->pw) <= m->scratch_elems)
        affine_depthwise(p, ti, to, x, y, batch, m->scratch, m->scratch_elems, lo, hi);
    else {
        affine_reference(p, ti, to, x, y, batch);
        return;
    }
    if (p->np_seed) perturb_nodes(p, y, (int64_t)batch * to->numel);
}

/* QAdd: TFLite reference_integer_ops::AddFunc (bpf_int8.h's bpf_add_s8); op->a holds its
 * constants in bpf_add_params' order. */
static KERNEL void add(const bpf_op *op, const int8_t *a, const int8_t *b, int8_t *y,
                       int64_t count) {
    bpf_add_params k;
    memcpy(&k, op->a, sizeof k);
    bpf_add_s8(a, b, count, &k, op->qmin, op->qmax, y);
}

static KERNEL void pool(const bpf_op *op, const bpf_tensor *ti, const bpf_tensor *to,
                        const int8_t *x, int8_t *y, int32_t batch) {
    for (int32_t n = 0; n < batch; n++)
        for (int32_t c = 0; c < to->c; c++) {
            const int8_t *xc = x + (int64_t)n * ti->numel + (int64_t)c * ti->h * ti->w;
            int8_t *yc = y + (int64_t)n * to->numel + (int64_t)c * to->h * to->w;
            for (int32_t oh = 0; oh < to->h; oh++)
                for (int32_t ow = 0; ow < to->w; ow++) {
                    int64_t sum = 0, count = 0, best = -129;
                    for (int32_t i = 0; i < op->kh; i++) {
                        int32_t ih = oh * op->sh - op->ph + i;
                        if (ih < 0 || ih >= ti->h) continue;
                        for (int32_t j = 0; j < op->kw; j++) {
                            int32_t iw = ow * op->sw - op->pw + j;
                            if (iw < 0 || iw >= ti->w) continue; /* padding never counts */
                            int64_t v = xc[ih * ti->w + iw];
                            sum += v;
                            count++;
                            if (v > best) best = v;
                        }
                    }
                    int64_t out = op->kind == OP_MAXPOOL ? best : rounding_divide(sum, count);
                    yc[oh * to->w + ow] = (int8_t)bpf_clamp(out, op->qmin, op->qmax);
                }
        }
}

/* QGlobalAvgPool2d, rule "reference" (a[4] == 0) or "litert" (1/(H*W) folded into a[2:4]). */
static KERNEL void gap(const bpf_op *op, const bpf_tensor *ti, const bpf_tensor *to,
                       const int8_t *x, int8_t *y, int32_t batch) {
    int64_t count = (int64_t)ti->h * ti->w;
    for (int32_t n = 0; n < batch; n++)
        for (int32_t c = 0; c < ti->c; c++) {
            const int8_t *xc = x + (int64_t)n * ti->numel + (int64_t)c * count;
            int64_t acc = 0;
            for (int64_t i = 0; i < count; i++) acc += xc[i];
            acc -= (int64_t)op->a[0] * count;
            acc = bpf_mbqm(acc, op->a[2], op->a[3]);
            if (!op->a[4]) acc = rounding_divide(acc, count);
            y[(int64_t)n * to->numel + c] = (int8_t)bpf_clamp(acc + op->a[1], -128, 127);
        }
}

/* The kernel class of an op (bpfree.device.lower.kernel_class). */
static int kernel_class_of(const bpf_model *m, const bpf_op *op) {
    if (op->kind == OP_ADD) return K_ADD;
    if (op->kind == OP_MAXPOOL || op->kind == OP_AVGPOOL || op->kind == OP_GAP) return K_POOL;
    if (op->kind != OP_AFFINE) return K_OTHER;
    const bpf_affine *p = &m->affine[op->param];
    const bpf_tensor *ti = &m->tensors[op->in];
    if (p->groups > 1 && p->groups == p->cin && p->groups == p->cout) return K_DEPTHWISE;
    if (p->groups > 1 || p->kh * p->kw > 1 || p->sh * p->sw > 1 || p->ph || p->pw)
        return K_CONV;
    return ti->h * ti->w == 1 ? K_LINEAR : K_POINTWISE;
}

#ifdef BPFREE_KERNEL_COUNTS
uint32_t BPFREE_COUNTER(void);
uint32_t bpf_kernel_ticks[K_CLASSES];
#endif

#ifdef BPFREE_KERNEL_COUNTS
#define COUNTED(cls, stmt) do { uint32_t before_ = BPFREE_COUNTER(); stmt; \
    bpf_kernel_ticks[cls] += before_ - BPFREE_COUNTER(); } while (0)
#else
#define COUNTED(cls, stmt) do { stmt; } while (0)
#endif

/* Output channels [c0, c0 + g) of an affine layer (groups 1, or depthwise: then its input
 * channels too) as a layer of its own: the same kernels compute the same values. */
static bpf_affine channel_block(const bpf_affine *p, int32_t c0, int32_t g) {
    bpf_affine s = *p;
    int64_t per = (int64_t)(p->cin / p->groups) * p->kh * p->kw;
    s.w_init = p->w_init + c0 * per;
    s.w = p->w + c0 * per;
    s.b_init = p->b_init + c0;
    s.b = p->b + c0;
    s.mult = p->mult + c0;
    s.shift = p->shift + c0;
    s.cout = g;
    if (p->groups > 1) s.cin = s.groups = g;
    return s;
}

static bpf_tensor channel_view(const bpf_tensor *t, int32_t g) {
    bpf_tensor s = *t;
    s.c = g;
    s.numel = (uint32_t)g * (uint32_t)(t->h * t->w);
    return s;
}

/* EXEC_FUSED: op (groups 1) and the depthwise after it, per sample and block of g channels:
 * g expanded channels into op's output slot (one block of one sample), then the depthwise's
 * g output channels from them. The expanded tensor never exists whole. */
static void run_fused(bpf_model *m, const bpf_op *op, int32_t batch) {
    const bpf_op *dw = op + 1;
    const bpf_affine *p = &m->affine[op->param], *d = &m->affine[dw->param];
    const bpf_tensor *ti = &m->tensors[op->in], *tm = &m->tensors[op->out];
    const bpf_tensor *to = &m->tensors[dw->out];
    int32_t g = op->a[1], cls_p = kernel_class_of(m, op), cls_d = kernel_class_of(m, dw);
    bpf_tensor vm = channel_view(tm, g), vo = channel_view(to, g);
    int8_t *mid = m->arena + tm->off;
    (void)cls_p;
    (void)cls_d;
    for (int32_t n = 0; n < batch; n++) {
        const int8_t *xn = m->arena + ti->off + (int64_t)n * ti->numel;
        int8_t *yn = m->arena + to->off + (int64_t)n * to->numel;
        for (int32_t c0 = 0; c0 < tm->c; c0 += g) {
            bpf_affine bp = channel_block(p, c0, g), bd = channel_block(d, c0, g);
            COUNTED(cls_p, affine(m, &bp, ti, &vm, xn, mid, 1));
            COUNTED(cls_d, affine(m, &bd, &vm, &vo, mid, yn + (int64_t)c0 * to->h * to->w, 1));
        }
    }
}

/* EXEC_INPLACE: a depthwise whose output (same shape) takes its input's bytes, per sample and
 * block of g channels through the staging block; output channel c reads input channel c only,
 * so each block overwrites input channels already consumed. */
static void run_inplace(bpf_model *m, const bpf_op *op, int32_t batch) {
    const bpf_affine *p = &m->affine[op->param];
    const bpf_tensor *ti = &m->tensors[op->in], *to = &m->tensors[op->out];
    int32_t g = op->a[1], hw = to->h * to->w, cls = kernel_class_of(m, op);
    bpf_tensor vi = channel_view(ti, g), vo = channel_view(to, g);
    int8_t *staging = m->arena + op->a[2];
    (void)cls;
    for (int32_t n = 0; n < batch; n++)
        for (int32_t c0 = 0; c0 < to->c; c0 += g) {
            bpf_affine b = channel_block(p, c0, g);
            int64_t at = (int64_t)n * to->numel + (int64_t)c0 * hw;
            COUNTED(cls, affine(m, &b, &vi, &vo, m->arena + ti->off + at, staging, 1);
                    memcpy(m->arena + to->off + at, staging, (size_t)g * hw));
        }
}

/* QPad (a .tflite's PAD): the zero point around each channel plane. */
static void pad(const bpf_op *op, const bpf_tensor *ti, const bpf_tensor *to, const int8_t *x,
                int8_t *y, int32_t batch) {
    int32_t top = op->a[0], left = op->a[2];
    for (int32_t n = 0; n < batch; n++)
        for (int32_t c = 0; c < to->c; c++) {
            const int8_t *xc = x + (int64_t)n * ti->numel + (int64_t)c * ti->h * ti->w;
            int8_t *yc = y + (int64_t)n * to->numel + (int64_t)c * to->h * to->w;
            memset(yc, op->a[4], (size_t)to->h * to->w);
            for (int32_t i = 0; i < ti->h; i++)
                memcpy(yc + (int64_t)(i + top) * to->w + left, xc + (int64_t)i * ti->w,
                       (size_t)ti->w);
        }
}

static void run_op(bpf_model *m, const bpf_op *op, const uint32_t *placement, int32_t batch) {
    const bpf_tensor *ti = &m->tensors[op->in], *to = &m->tensors[op->out];
    const int8_t *x = tensor_at(m, op->in, placement);
    int8_t *y = tensor_at(m, op->out, placement);
    int64_t count = (int64_t)batch * to->numel;
    switch (op->kind) {
    case OP_AFFINE: affine(m, &m->affine[op->param], ti, to, x, y, batch); break;
    case OP_ADD: add(op, x, tensor_at(m, op->in2, placement), y, count); break;
    case OP_MAXPOOL:
    case OP_AVGPOOL: pool(op, ti, to, x, y, batch); break;
    case OP_GAP: gap(op, ti, to, x, y, batch); break;
    case OP_PAD: pad(op, ti, to, x, y, batch); break;
    case OP_CLAMP:
        for (int64_t i = 0; i < count; i++) y[i] = (int8_t)bpf_clamp(x[i], op->qmin, op->qmax);
        break;
    default: memmove(y, x, (size_t)count); break;
    }
}

/* Runs ops[first_op:end_op] on `batch` samples. placement NULL: a clean pass (every tensor at
 * its `off`); else a perturbed pass with the tensors where `placement` puts them. */
void bpf_forward(bpf_model *m, int32_t first_op, int32_t end_op, const uint32_t *placement,
                 int32_t batch) {
    for (int32_t k = first_op; k < end_op; k++) {
        const bpf_op *op = &m->ops[k];
        /* The frozen prefix's schedule: only clean passes (the clean forward, inference) run
         * those ops. */
        int32_t exec = op->kind == OP_AFFINE && !placement ? op->a[0] : EXEC_PLAIN;
        if (exec == EXEC_FUSED) run_fused(m, op, batch);
        else if (exec == EXEC_INPLACE) run_inplace(m, op, batch);
        else if (exec == EXEC_PLAIN)
            COUNTED(kernel_class_of(m, op), run_op(m, op, placement, batch));
    }
}

/* floor-style log2 of s > 0 with LOSS_BITS fractional bits (bpfree.pmt.exact.log2_fixed). */
static int64_t log2_fixed(int64_t s) {
    int32_t e = 0;
    while (e < 62 && ((int64_t)1 << (e + 1)) <= s) e++;
    uint64_t x = e <= EXP_BITS ? (uint64_t)s << (EXP_BITS - e) : (uint64_t)s >> (e - EXP_BITS);
    int64_t r = (int64_t)e << LOSS_BITS;
    for (int32_t i = 0; i < LOSS_BITS; i++) {
        x = (x * x) >> EXP_BITS;
        if (x >= ((uint64_t)1 << (EXP_BITS + 1))) {
            x >>= 1;
            r += (int64_t)1 << (LOSS_BITS - 1 - i);
        }
    }
    return r;
}

/* Cross-entropy of int8 logits in 2^-24 nats (bpfree.pmt.exact.fixed_loss). */
int64_t bpf_fixed_loss(const int8_t *q, int32_t classes, int32_t label,
                       const int64_t *exp_table, const int64_t *logit_table) {
    int32_t mx = q[0];
    for (int32_t j = 1; j < classes; j++) if (q[j] > mx) mx = q[j];
    int64_t total = 0;
    for (int32_t j = 0; j < classes; j++) total += exp_table[mx - q[j]];
    int64_t lse = ((log2_fixed(total) - ((int64_t)EXP_BITS << LOSS_BITS)) * LN2_Q) >> EXP_BITS;
    return logit_table[mx - q[label]] + lse;
}

static void losses(bpf_model *m, const uint32_t *placement, const int32_t *y, int32_t batch,
                   int64_t *out) {
    int32_t last = m->ops[m->n_ops - 1].out;
    const int8_t *logits = tensor_at(m, last, placement);
    for (int32_t n = 0; n < batch; n++)
        out[n] = bpf_fixed_loss(logits + (int64_t)n * m->num_classes, m->num_classes, y[n],
                                m->exp_table, m->logit_table);
}

void bpf_reset(bpf_model *m) {
    for (int32_t t = 0; t < m->n_trainable; t++) {
        bpf_affine *p = &m->affine[m->ops[m->trainable[t].op].param];
        memcpy(p->w, p->w_init, (size_t)m->trainable[t].d_w);
        if (p->b != p->b_init) /* WP layers train no bias: theirs stays in flash */
            memcpy(p->b, p->b_init, sizeof(int32_t) * (size_t)p->cout);
    }
    m->steps = 0;
}

static uint32_t query_seed(uint32_t seed, const bpf_trainable *t, int32_t q) {
    uint64_t idx[2] = {(uint64_t)t->layer_index, (uint64_t)q};
    return bpf_derive_seed(seed, 2, idx);
}

/* Algorithm 1 lines 9-11 (WP, Eq. 6) or 19-24 (NP, Eq. 9): Q perturbed partial forwards from
 * the layer's stage input. Only the loss differences are kept; the estimate is replayed from
 * them and the seeds in finish(). */
static void estimate(bpf_model *m, const bpf_trainable *t, uint32_t seed, const int32_t *y,
                     int32_t batch) {
    const bpf_op *op = &m->ops[t->op];
    bpf_affine *p = &m->affine[op->param];
    int32_t first = m->stage_first_op[t->stage];
    int64_t *d = m->diffs + t->diff_off;
    if (t->mode == MODE_WP) memcpy(m->backup, p->w, (size_t)t->d_w);
    for (int32_t q = 0; q < m->queries; q++) {
        uint32_t s = query_seed(seed, t, q);
        if (t->mode == MODE_WP) {
            for (int32_t i = 0; i < t->d_w; i++) {
                s = xorshift32(s);
                p->w[i] = (int8_t)bpf_clamp((int64_t)m->backup[i] + RADEMACHER(s), -128, 127);
            }
        } else {
            p->np_seed = s;
        }
        bpf_forward(m, first, m->n_ops, t->perturbed, batch);
        p->np_seed = 0;
        losses(m, t->perturbed, y, batch, m->loss_q);
        if (t->mode == MODE_WP) {
            int64_t sum = 0;
            for (int32_t n = 0; n < batch; n++) sum += m->loss_q[n] - m->loss[n];
            d[q] = sum;
        } else {
            for (int32_t n = 0; n < batch; n++) d[q * batch + n] = m->loss_q[n] - m->loss[n];
        }
    }
    if (t->mode == MODE_WP) memcpy(p->w, m->backup, (size_t)t->d_w);
}

/* Eq. 8 and 11 per output channel: the multipliers c of W <- clip(rint(W - G c)),
 * c = lr GNS QAS[ch] (M[ch] for NP) / (N Q) 2^-24, in bpfree.pmt.exact's order. */
static void coefficients(const bpf_model *m, const bpf_trainable *t, double lr,
                         int32_t samples, int32_t c, double *cw, double *cb) {
    int64_t dim = t->mode == MODE_WP ? t->d_w : t->d_a;
    double step = lr * t->lr_scale;
    if (m->gns) step = step * ((double)t->directions / (double)(t->directions + dim - 1));
    double w = step * (m->qas ? t->qas_w[c] : 1.0);
    double b = step * (m->qas ? t->qas_b[c] : 1.0);
    if (t->mode == MODE_NP) {
        w = w * t->requant[c];
        b = b * t->requant[c];
    }
    double denom = (double)((int64_t)samples * m->queries);
    double scale = 1.0 / (double)(1L << LOSS_BITS);
    *cw = w / denom * scale;
    *cb = b / denom * scale;
}

static int8_t updated_weight(int8_t w, int64_t g, double c) {
    double v = rint((double)w - (double)g * c);
    return (int8_t)(v < -128.0 ? -128 : (v > 127.0 ? 127 : v));
}

static int32_t updated_bias(int32_t b, int64_t g, double c) {
    double v = rint((double)b - (double)g * c);
    return (int32_t)(v < -2147483648.0 ? -2147483648.0 : (v > 2147483647.0 ? 2147483647.0 : v));
}

/* One weight's estimate G: applied at once (Algorithm 1 line 33), or added to the micro-batch
 * sums when the update waits for the last micro-batch. */
static void apply_weight(bpf_trainable *t, bpf_affine *p, int64_t i, int64_t g, double c,
                         int deferred) {
    if (deferred) t->gw[i] += g;
    else p->w[i] = updated_weight(p->w[i], g, c);
}

/* WP (Algorithm 1 lines 12-16): G_i = sum_q d_q xi_q,i, the Q streams replayed side by side. */
static void finish_wp(bpf_model *m, bpf_trainable *t, uint32_t seed, double lr, int32_t samples,
                      int deferred) {
    bpf_affine *p = &m->affine[m->ops[t->op].param];
    const int64_t *d = m->diffs + t->diff_off;
    int32_t Q = m->queries, per = t->d_w / p->cout;
    for (int32_t q = 0; q < Q; q++) m->states[q] = query_seed(seed, t, q);
    if (deferred) t->directions += Q;
    else t->directions = Q;
    for (int32_t c = 0; c < p->cout; c++) {
        double cw = 0.0, cb = 0.0;
        if (!deferred) coefficients(m, t, lr, samples, c, &cw, &cb);
        for (int32_t i = c * per; i < (c + 1) * per; i++) {
            int64_t g = 0;
            for (int32_t q = 0; q < Q; q++) {
                uint32_t s = m->states[q] = xorshift32(m->states[q]);
                g += d[q] * RADEMACHER(s);
            }
            apply_weight(t, p, i, g, cw, deferred);
        }
    }
}

/* NP (Algorithm 1 lines 25-31, Eq. 10): per output channel, the node gradient
 * g_z = sum_q d_q,n xi_q,n is regenerated from the Q*N streams, then
 * G_w = sum_n,pos g_z (x - z_x) and G_b = sum g_z with x the layer's clean input, which the
 * stage pass has just computed. */
static void finish_np(bpf_model *m, bpf_trainable *t, uint32_t seed, double lr,
                      int32_t samples, int32_t batch, int deferred) {
    const bpf_op *op = &m->ops[t->op];
    bpf_affine *p = &m->affine[op->param];
    const bpf_tensor *ti = &m->tensors[op->in], *to = &m->tensors[op->out];
    const int8_t *x = m->arena + ti->off;
    const int64_t *d = m->diffs + t->diff_off;
    int32_t Q = m->queries, hw = to->h * to->w;
    int32_t cin_g = p->cin / p->groups, cout_g = p->cout / p->groups;
    int32_t per = cin_g * p->kh * p->kw;
    /* Stream (q, n) starts where sample n's nodes start in query q's stream (output order). */
    for (int32_t q = 0; q < Q; q++) {
        uint32_t s = query_seed(seed, t, q);
        for (int32_t n = 0; n < batch; n++) {
            m->states[q * batch + n] = s;
            if (n + 1 < batch)
                for (int32_t i = 0; i < t->d_a; i++) s = xorshift32(s);
        }
    }
    if (deferred) t->directions += (int64_t)batch * Q;
    else t->directions = (int64_t)batch * Q;
    int64_t *z = m->node_grad;
    for (int32_t co = 0; co < p->cout; co++) {
        int32_t g = co / cout_g;
        double cw = 0.0, cb = 0.0;
        if (!deferred) coefficients(m, t, lr, samples, co, &cw, &cb);
        int64_t gb = 0;
        for (int32_t n = 0; n < batch; n++)
            for (int32_t e = 0; e < hw; e++) {
                int64_t v = 0;
                for (int32_t q = 0; q < Q; q++) {
                    uint32_t s = m->states[q * batch + n] = xorshift32(m->states[q * batch + n]);
                    v += d[q * batch + n] * RADEMACHER(s);
                }
                z[(int64_t)n * hw + e] = v;
                gb += v;
            }
        for (int32_t k = 0; k < per; k++) {
            int32_t ci = k / (p->kh * p->kw), i = k / p->kw % p->kh, j = k % p->kw;
            int64_t gw = 0;
            for (int32_t n = 0; n < batch; n++) {
                const int8_t *xc = x + (int64_t)n * ti->numel +
                                   (int64_t)(g * cin_g + ci) * ti->h * ti->w;
                const int64_t *zn = z + (int64_t)n * hw;
                for (int32_t oh = 0; oh < to->h; oh++) {
                    int32_t ih = oh * p->sh - p->ph + i * p->dh;
                    if (ih < 0 || ih >= ti->h) continue;
                    for (int32_t ow = 0; ow < to->w; ow++) {
                        int32_t iw = ow * p->sw - p->pw + j * p->dw;
                        if (iw < 0 || iw >= ti->w) continue;
                        gw += zn[oh * to->w + ow] * ((int64_t)xc[ih * ti->w + iw] - p->in_zp);
                    }
                }
            }
            apply_weight(t, p, (int64_t)co * per + k, gw, cw, deferred);
        }
        if (deferred) t->gb[co] += gb;
        else p->b[co] = updated_bias(p->b[co], gb, cb);
    }
}

static void finish(bpf_model *m, bpf_trainable *t, uint32_t seed, double lr, int32_t samples,
                   int32_t batch, int deferred) {
    if (t->mode == MODE_WP) finish_wp(m, t, seed, lr, samples, deferred);
    else finish_np(m, t, seed, lr, samples, batch, deferred);
}

/* After the last micro-batch: Eq. 8 / 11 from the accumulated integer sums. */
static void update_from_sums(bpf_model *m, bpf_trainable *t, double lr, int32_t samples) {
    bpf_affine *p = &m->affine[m->ops[t->op].param];
    int32_t per = t->d_w / p->cout;
    for (int32_t c = 0; c < p->cout; c++) {
        double cw, cb;
        coefficients(m, t, lr, samples, c, &cw, &cb);
        for (int32_t i = c * per; i < (c + 1) * per; i++)
            p->w[i] = updated_weight(p->w[i], t->gw[i], cw);
        if (t->mode == MODE_NP) p->b[c] = updated_bias(p->b[c], t->gb[c], cb);
    }
}

/* One device-exact iteration of Algorithm 1 (bpfree.pmt.exact.exact_step) on n samples, with
 * the stage schedule of bpfree.device.plan: one held stage input, no stored gradients. */
int bpf_step(bpf_model *m, const int8_t *x, const int32_t *y, int32_t n, double lr,
             int64_t *loss_sum) {
    int32_t size = m->micro_batch > 0 ? m->micro_batch : n;
    int deferred = m->micro_batch > 0;
    if (size > m->max_batch || n < 1) return -1;
    int64_t total = 0;
    if (deferred)
        for (int32_t t = 0; t < m->n_trainable; t++) {
            bpf_trainable *tr = &m->trainable[t];
            memset(tr->gw, 0, sizeof(int64_t) * (size_t)tr->d_w);
            memset(tr->gb, 0, sizeof(int64_t) * (size_t)m->affine[m->ops[tr->op].param].cout);
            tr->directions = 0;
        }
    const bpf_tensor *in = &m->tensors[0];
    for (int32_t j = 0, lo = 0; lo < n; j++, lo += size) {
        int32_t mb = n - lo < size ? n - lo : size;
        const int8_t *xb = x + (int64_t)lo * in->numel;
        if (xb != m->arena + in->off) memmove(m->arena + in->off, xb, (size_t)mb * in->numel);
        bpf_forward(m, 0, m->n_ops, NULL, mb);
        losses(m, NULL, y + lo, mb, m->loss);
        for (int32_t i = 0; i < mb; i++) total += m->loss[i];
        uint64_t idx[2] = {(uint64_t)m->steps, (uint64_t)j};
        uint32_t seed = bpf_derive_seed(m->seed, 2, idx);
        /* The clean forward kept the first trainable stage's input; later stage inputs come
         * from the stage passes. */
        int32_t cursor = m->stage_first_op[m->trainable[0].stage];
        for (int32_t t = 0; t < m->n_trainable;) {
            int32_t stage = m->trainable[t].stage, first = m->stage_first_op[stage];
            bpf_forward(m, cursor, first, NULL, mb);  /* frozen stages in between */
            int32_t u = t;
            for (; u < m->n_trainable && m->trainable[u].stage == stage; u++)
                estimate(m, &m->trainable[u], seed, y + lo, mb);
            /* The stage pass (line 34): step-t activations, each layer finished right after
             * its operator, while its input is still in the arena. */
            int32_t end = u == m->n_trainable ? m->trainable[u - 1].op + 1
                                              : m->stage_first_op[stage + 1];
            for (int32_t k = first, v = t; k < end; k++) {
                bpf_forward(m, k, k + 1, NULL, mb);
                if (v < u && m->trainable[v].op == k)
                    finish(m, &m->trainable[v++], seed, lr, n, mb, deferred);
            }
            cursor = end;
            t = u;
        }
    }
    if (deferred)
        for (int32_t t = 0; t < m->n_trainable; t++)
            update_from_sums(m, &m->trainable[t], lr, n);
    m->steps++;
    *loss_sum = total;
    return 0;
}
