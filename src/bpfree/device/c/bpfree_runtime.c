/* bpfree device runtime. Every kernel mirrors a bpfree.quant layer (TFLite int8 reference
 * semantics) and the step mirrors bpfree.pmt.exact, operation for operation; see those modules
 * for the equations. Compile with -ffp-contract=off: the update's float64 products must not
 * be fused. */
#include "bpfree_runtime.h"
#include <math.h>
#include <string.h>

#define I32_MIN (-2147483647LL - 1)
#define I32_MAX 2147483647LL
#define LOSS_BITS 24
#define EXP_BITS 30
#define LN2_Q 744261118LL /* round(ln 2 * 2^30) */

static int64_t sat32(int64_t v) { return v < I32_MIN ? I32_MIN : (v > I32_MAX ? I32_MAX : v); }
static int32_t clampi(int64_t v, int32_t lo, int32_t hi) {
    return (int32_t)(v < lo ? lo : (v > hi ? hi : v));
}

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

/* gemmlowp MultiplyByQuantizedMultiplier (bpfree.quant.fixed_point._mbqm_int64). */
static int64_t mbqm(int64_t x, int64_t mult, int32_t shift) {
    int32_t left = shift > 0 ? shift : 0, right = shift < 0 ? -shift : 0;
    if (left) x = sat32(x * ((int64_t)1 << left));
    int64_t h = (x * mult + ((int64_t)1 << 30)) >> 31;
    if (h > I32_MAX) h = I32_MAX;
    if (right == 0) return h;
    return (h + ((int64_t)1 << (right - 1)) + (h < 0 ? -1 : 0)) >> right;
}

static int64_t rounding_divide(int64_t acc, int64_t count) {
    int64_t half = count / 2;
    return (acc > 0 ? acc + half : acc - half) / count;
}

static int8_t *tensor_at(bpf_model *m, int32_t t, int32_t start) {
    const bpf_tensor *d = &m->tensors[t];
    return m->arena + ((start < 0 || t == start) ? d->off : d->alt);
}

/* QConv2d / QLinear (a linear layer is a 1x1 convolution on a 1x1 map). Output elements are
 * produced in (n, c, h, w) order, the order of the node perturbation's XORShift32 stream. */
static void affine(const bpf_affine *p, const bpf_tensor *ti, const bpf_tensor *to,
                   const int8_t *x, int8_t *y, int32_t batch) {
    uint32_t s = p->np_seed;
    int32_t cin_g = p->cin / p->groups, cout_g = p->cout / p->groups;
    for (int32_t n = 0; n < batch; n++) {
        const int8_t *xn = x + (int64_t)n * ti->numel;
        int8_t *yn = y + (int64_t)n * to->numel;
        for (int32_t co = 0; co < p->cout; co++) {
            int32_t g = co / cout_g;
            const int8_t *wc = p->w + (int64_t)co * cin_g * p->kh * p->kw;
            for (int32_t oh = 0; oh < to->h; oh++) {
                for (int32_t ow = 0; ow < to->w; ow++) {
                    int64_t acc = 0;
                    for (int32_t ci = 0; ci < cin_g; ci++) {
                        const int8_t *xc = xn + (int64_t)(g * cin_g + ci) * ti->h * ti->w;
                        for (int32_t i = 0; i < p->kh; i++) {
                            int32_t ih = oh * p->sh - p->ph + i * p->dh;
                            if (ih < 0 || ih >= ti->h) continue;
                            for (int32_t j = 0; j < p->kw; j++) {
                                int32_t iw = ow * p->sw - p->pw + j * p->dw;
                                if (iw < 0 || iw >= ti->w) continue; /* padding = zero point */
                                acc += (int64_t)wc[(ci * p->kh + i) * p->kw + j] *
                                       ((int64_t)xc[ih * ti->w + iw] - p->in_zp);
                            }
                        }
                    }
                    int64_t v = sat32(acc + p->b[co]);
                    int64_t z = mbqm(v, p->mult[co], p->shift[co]) + p->out_zp;
                    z = clampi(z, -128, 127);
                    if (p->np_seed) {
                        s = xorshift32(s);
                        z += RADEMACHER(s);
                    }
                    yn[((int64_t)co * to->h + oh) * to->w + ow] = (int8_t)clampi(z, p->qmin,
                                                                                p->qmax);
                }
            }
        }
    }
}

/* QAdd: TFLite reference_integer_ops::AddFunc. */
static void add(const bpf_op *op, const int8_t *a, const int8_t *b, int8_t *y, int64_t count) {
    const int32_t *k = op->a;
    int64_t off1 = k[0], off2 = k[1], scale = (int64_t)1 << k[2];
    int64_t m1 = k[3], m2 = k[5], mo = k[7];
    int32_t s1 = k[4], s2 = k[6], so = k[8];
    for (int64_t i = 0; i < count; i++) {
        int64_t h1 = mbqm(((int64_t)a[i] + off1) * scale, m1, s1);
        int64_t h2 = mbqm(((int64_t)b[i] + off2) * scale, m2, s2);
        y[i] = (int8_t)clampi(mbqm(h1 + h2, mo, so) + k[9], op->qmin, op->qmax);
    }
}

static void pool(const bpf_op *op, const bpf_tensor *ti, const bpf_tensor *to, const int8_t *x,
                 int8_t *y, int32_t batch) {
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
                    yc[oh * to->w + ow] = (int8_t)clampi(out, op->qmin, op->qmax);
                }
        }
}

/* QGlobalAvgPool2d, rule "reference" (a[4] == 0) or "litert" (1/(H*W) folded into a[2:4]). */
static void gap(const bpf_op *op, const bpf_tensor *ti, const bpf_tensor *to, const int8_t *x,
                int8_t *y, int32_t batch) {
    int64_t count = (int64_t)ti->h * ti->w;
    for (int32_t n = 0; n < batch; n++)
        for (int32_t c = 0; c < ti->c; c++) {
            const int8_t *xc = x + (int64_t)n * ti->numel + (int64_t)c * count;
            int64_t acc = 0;
            for (int64_t i = 0; i < count; i++) acc += xc[i];
            acc -= (int64_t)op->a[0] * count;
            acc = mbqm(acc, op->a[2], op->a[3]);
            if (!op->a[4]) acc = rounding_divide(acc, count);
            y[(int64_t)n * to->numel + c] = (int8_t)clampi(acc + op->a[1], -128, 127);
        }
}

/* Runs ops[first_op:] on `batch` samples. start_tensor < 0: the clean forward (every tensor at
 * its `off`); else a partial forward from the cached start_tensor (the others at `alt`). */
void bpf_forward(bpf_model *m, int32_t first_op, int32_t start_tensor, int32_t batch) {
    for (int32_t k = first_op; k < m->n_ops; k++) {
        const bpf_op *op = &m->ops[k];
        const bpf_tensor *ti = &m->tensors[op->in], *to = &m->tensors[op->out];
        const int8_t *x = tensor_at(m, op->in, start_tensor);
        int8_t *y = tensor_at(m, op->out, start_tensor);
        int64_t count = (int64_t)batch * to->numel;
        switch (op->kind) {
        case OP_AFFINE: affine(&m->affine[op->param], ti, to, x, y, batch); break;
        case OP_ADD: add(op, x, tensor_at(m, op->in2, start_tensor), y, count); break;
        case OP_MAXPOOL:
        case OP_AVGPOOL: pool(op, ti, to, x, y, batch); break;
        case OP_GAP: gap(op, ti, to, x, y, batch); break;
        case OP_CLAMP:
            for (int64_t i = 0; i < count; i++) y[i] = (int8_t)clampi(x[i], op->qmin, op->qmax);
            break;
        default: memmove(y, x, (size_t)count); break;
        }
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

static void losses(bpf_model *m, int32_t start, const int32_t *y, int32_t batch, int64_t *out) {
    int32_t last = m->ops[m->n_ops - 1].out;
    const int8_t *logits = tensor_at(m, last, start);
    for (int32_t n = 0; n < batch; n++)
        out[n] = bpf_fixed_loss(logits + (int64_t)n * m->num_classes, m->num_classes, y[n],
                                m->exp_table, m->logit_table);
}

void bpf_reset(bpf_model *m) {
    for (int32_t t = 0; t < m->n_trainable; t++) {
        bpf_affine *p = &m->affine[m->ops[m->trainable[t].op].param];
        memcpy(p->w, p->w_init, (size_t)m->trainable[t].d_w);
        memcpy(p->b, p->b_init, sizeof(int32_t) * (size_t)p->cout);
    }
    m->steps = 0;
}

/* Eq. 6 (WP) or Eq. 9-10 (NP) for one layer on one micro-batch: Q perturbed partial forwards
 * from the layer's stage, integer sums added to the layer's gw / gb. */
static void estimate(bpf_model *m, bpf_trainable *t, uint32_t seed, const int32_t *y,
                     int32_t batch) {
    bpf_op *op = &m->ops[t->op];
    bpf_affine *p = &m->affine[op->param];
    int32_t first = m->stage_first_op[op->stage];
    int32_t start = m->ops[first].in;
    uint64_t idx[2];
    idx[0] = (uint64_t)t->layer_index;
    if (t->mode == MODE_WP) {
        memcpy(m->backup, p->w, (size_t)t->d_w);
        for (int32_t q = 0; q < m->queries; q++) {
            idx[1] = (uint64_t)q;
            uint32_t s0 = bpf_derive_seed(seed, 2, idx), s = s0;
            for (int32_t i = 0; i < t->d_w; i++) {
                s = xorshift32(s);
                p->w[i] = (int8_t)clampi((int64_t)m->backup[i] + RADEMACHER(s), -128, 127);
            }
            bpf_forward(m, first, start, batch);
            losses(m, start, y, batch, m->loss_q);
            int64_t d = 0;
            for (int32_t n = 0; n < batch; n++) d += m->loss_q[n] - m->loss[n];
            s = s0;
            for (int32_t i = 0; i < t->d_w; i++) {
                s = xorshift32(s);
                t->gw[i] = (int64_t)((uint64_t)t->gw[i] + (uint64_t)(d * RADEMACHER(s)));
            }
        }
        memcpy(p->w, m->backup, (size_t)t->d_w);
        t->directions += m->queries;
        return;
    }
    int64_t total = (int64_t)batch * t->d_a;
    int64_t *z = m->node_grad;
    for (int64_t i = 0; i < total; i++) z[i] = 0;
    for (int32_t q = 0; q < m->queries; q++) {
        idx[1] = (uint64_t)q;
        uint32_t s0 = bpf_derive_seed(seed, 2, idx), s = s0;
        p->np_seed = s0;
        bpf_forward(m, first, start, batch);
        p->np_seed = 0;
        losses(m, start, y, batch, m->loss_q);
        for (int64_t i = 0; i < total; i++) {
            s = xorshift32(s);
            z[i] += (m->loss_q[i / t->d_a] - m->loss[i / t->d_a]) * RADEMACHER(s);
        }
    }
    /* Eq. 10 through the integer graph: sums of g_z (x - z_x) and of g_z. */
    const bpf_tensor *ti = &m->tensors[op->in], *to = &m->tensors[op->out];
    const int8_t *x = m->arena + ti->off;
    int32_t cin_g = p->cin / p->groups, cout_g = p->cout / p->groups;
    for (int32_t n = 0; n < batch; n++)
        for (int32_t co = 0; co < p->cout; co++) {
            int32_t g = co / cout_g;
            for (int32_t oh = 0; oh < to->h; oh++)
                for (int32_t ow = 0; ow < to->w; ow++) {
                    int64_t gz = z[(int64_t)n * to->numel + ((int64_t)co * to->h + oh) * to->w + ow];
                    if (!gz) continue;
                    t->gb[co] += gz;
                    for (int32_t ci = 0; ci < cin_g; ci++) {
                        const int8_t *xc = x + (int64_t)n * ti->numel +
                                           (int64_t)(g * cin_g + ci) * ti->h * ti->w;
                        for (int32_t i = 0; i < p->kh; i++) {
                            int32_t ih = oh * p->sh - p->ph + i * p->dh;
                            if (ih < 0 || ih >= ti->h) continue;
                            for (int32_t j = 0; j < p->kw; j++) {
                                int32_t iw = ow * p->sw - p->pw + j * p->dw;
                                if (iw < 0 || iw >= ti->w) continue;
                                t->gw[((int64_t)co * cin_g + ci) * p->kh * p->kw + i * p->kw + j] +=
                                    gz * ((int64_t)xc[ih * ti->w + iw] - p->in_zp);
                            }
                        }
                    }
                }
        }
    t->directions += (int64_t)batch * m->queries;
}

/* Eq. 8 and 11: W <- clip(rint(W - G c)), c = lr GNS QAS[ch] (M[ch] for NP) / (N Q) 2^-24. */
static void update(bpf_model *m, bpf_trainable *t, double lr, int32_t samples) {
    bpf_affine *p = &m->affine[m->ops[t->op].param];
    int64_t dim = t->mode == MODE_WP ? t->d_w : t->d_a;
    double rate = lr * t->lr_scale;
    double gns = m->gns ? (double)t->directions / (double)(t->directions + dim - 1) : 1.0;
    double step = rate * gns;
    double denom = (double)((int64_t)samples * m->queries);
    double scale = 1.0 / (double)(1L << LOSS_BITS);
    int32_t per = t->d_w / p->cout;
    for (int32_t c = 0; c < p->cout; c++) {
        double cw = step * (m->qas ? t->qas_w[c] : 1.0);
        double cb = step * (m->qas ? t->qas_b[c] : 1.0);
        if (t->mode == MODE_NP) {
            cw = cw * t->requant[c];
            cb = cb * t->requant[c];
        }
        cw = cw / denom * scale;
        cb = cb / denom * scale;
        for (int32_t i = c * per; i < (c + 1) * per; i++) {
            double v = rint((double)p->w[i] - (double)t->gw[i] * cw);
            p->w[i] = (int8_t)(v < -128.0 ? -128 : (v > 127.0 ? 127 : v));
        }
        if (t->mode == MODE_NP) {
            double v = rint((double)p->b[c] - (double)t->gb[c] * cb);
            p->b[c] = (int32_t)(v < -2147483648.0 ? -2147483648.0 : (v > 2147483647.0 ? 2147483647.0 : v));
        }
    }
}

/* One device-exact iteration of Algorithm 1 (bpfree.pmt.exact.exact_step) on n samples. */
int bpf_step(bpf_model *m, const int8_t *x, const int32_t *y, int32_t n, double lr,
             int64_t *loss_sum) {
    int32_t size = m->micro_batch > 0 ? m->micro_batch : n;
    if (size > m->max_batch || n < 1) return -1;
    int64_t total = 0;
    for (int32_t t = 0; t < m->n_trainable; t++) {
        bpf_trainable *tr = &m->trainable[t];
        memset(tr->gw, 0, sizeof(int64_t) * (size_t)tr->d_w);
        memset(tr->gb, 0, sizeof(int64_t) * (size_t)m->affine[m->ops[tr->op].param].cout);
        tr->directions = 0;
    }
    const bpf_tensor *in = &m->tensors[0];
    for (int32_t j = 0, lo = 0; lo < n; j++, lo += size) {
        int32_t mb = n - lo < size ? n - lo : size;
        memcpy(m->arena + in->off, x + (int64_t)lo * in->numel, (size_t)mb * in->numel);
        bpf_forward(m, 0, -1, mb);
        losses(m, -1, y + lo, mb, m->loss);
        for (int32_t i = 0; i < mb; i++) total += m->loss[i];
        uint64_t idx[2] = {(uint64_t)m->steps, (uint64_t)j};
        uint32_t seed = bpf_derive_seed(m->seed, 2, idx);
        for (int32_t t = 0; t < m->n_trainable; t++)
            estimate(m, &m->trainable[t], seed, y + lo, mb);
    }
    for (int32_t t = 0; t < m->n_trainable; t++) update(m, &m->trainable[t], lr, n);
    m->steps++;
    *loss_sum = total;
    return 0;
}
