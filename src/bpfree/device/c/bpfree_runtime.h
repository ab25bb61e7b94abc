/* bpfree device runtime: int8 kernels (TFLite reference semantics), XORShift32 (PMT App. F)
 * and the device-exact PMT step (bpfree.pmt.exact). C99, no malloc, libc + libm only.
 * The model-specific tables live in the generated model.c. */
#ifndef BPFREE_RUNTIME_H
#define BPFREE_RUNTIME_H
#include <stdint.h>

enum { OP_AFFINE = 0, OP_ADD = 1, OP_MAXPOOL = 2, OP_AVGPOOL = 3, OP_GAP = 4, OP_CLAMP = 5,
       OP_COPY = 6, OP_PAD = 7 };
enum { MODE_WP = 0, MODE_NP = 1 };
/* How a frozen-prefix affine op runs in a clean pass (bpfree.device.plan.prefix_schedule):
 * as is; fused with the depthwise after it, a block of channels at a time; skipped (run by
 * the fused op before it); or in place over its input through a staging block. */
enum { EXEC_PLAIN = 0, EXEC_FUSED = 1, EXEC_DONE = 2, EXEC_INPLACE = 3 };
/* Kernel classes of the per-kernel instruction counts (BPFREE_KERNEL_COUNTS). */
enum { K_CONV = 0, K_POINTWISE = 1, K_DEPTHWISE = 2, K_LINEAR = 3, K_POOL = 4, K_ADD = 5,
       K_OTHER = 6, K_CLASSES = 7 };

/* An int8 tensor in the arena: NCHW, `numel` elements per sample. `off` is where the clean
 * forward and the stage passes write it; a perturbed partial forward writes it where its
 * stage's table says (bpf_trainable.perturbed), so the held stage input survives the Q
 * queries (bpfree.device.plan). */
typedef struct { uint32_t off, numel; int32_t c, h, w; } bpf_tensor;

typedef struct {
    const int8_t *w_init;  /* flash */
    int8_t *w;             /* SRAM copy for trainable layers, == w_init otherwise */
    const int32_t *b_init;
    int32_t *b;
    const int32_t *mult, *shift;
    int32_t cout, cin, kh, kw, sh, sw, ph, pw, dh, dw, groups;
    int32_t in_zp, out_zp, qmin, qmax;
    uint32_t np_seed;      /* nonzero: add Rademacher node perturbation (Eq. 9) before clamp */
    /* Fully connected layers with a float-scale epilogue (LiteRT's FULLY_CONNECTED,
     * bpfree FloatRuleLinear): per output channel round((acc + bias) * eff) + out_zp,
     * rounding 1 half away from zero (round), 0 half to even (rint); NULL: fixed point. */
    const double *eff;
    int32_t rounding;
} bpf_affine;

typedef struct {
    int32_t kind, in, in2, out, param, stage;
    /* pools: kernel, stride, padding; clamp: qmin, qmax; add and gap: multipliers */
    int32_t kh, kw, sh, sw, ph, pw, qmin, qmax;
    /* add and gap: constants; pad: top, bottom, left, right, value; affine: a[0] EXEC_*, a[1] channels per block, a[2] the
     * staging block's arena offset (EXEC_INPLACE) */
    int32_t a[12];
} bpf_op;

typedef struct {
    int32_t op;            /* index of the affine op */
    int32_t layer_index;   /* index among all integer layers (perturbation seeds) */
    int32_t mode;          /* MODE_WP / MODE_NP */
    int32_t stage;
    int32_t d_w, d_a;
    const double *qas_w, *qas_b, *requant;  /* per output channel (App. B, Eq. 10) */
    double lr_scale;
    int32_t diff_off;      /* first slot of this layer's loss differences in bpf_model.diffs */
    const uint32_t *perturbed;  /* arena offset of every tensor in a perturbed pass */
    int64_t *gw, *gb;      /* micro-batch accumulation only: integer sums of the step */
    int64_t directions;
} bpf_trainable;

typedef struct {
    int32_t n_ops, n_tensors, n_trainable, max_batch, num_classes;
    const bpf_op *ops;
    const bpf_tensor *tensors;
    bpf_affine *affine;
    bpf_trainable *trainable;   /* in forward order */
    const int32_t *stage_first_op;  /* one entry per stage, then n_ops */
    const int64_t *exp_table, *logit_table;
    uint64_t seed;
    int32_t queries, micro_batch, gns, qas;
    int8_t *arena;
    int64_t *loss, *loss_q;
    int64_t *diffs;        /* l_q - l per query (WP: batch sum; NP: per sample) */
    uint32_t *states;      /* replayed XORShift32 streams, one per query (and sample for NP) */
    int64_t *node_grad;    /* one output channel of the regenerated node gradient (NP) */
    int8_t *backup;
    int64_t steps;
    int16_t *scratch;      /* the kernels' im2col columns / depthwise rows (bpfree.device.plan) */
    int32_t scratch_elems;
} bpf_model;

uint32_t bpf_derive_seed(uint64_t base, int count, const uint64_t *indices);
int64_t bpf_fixed_loss(const int8_t *logits, int32_t classes, int32_t label,
                       const int64_t *exp_table, const int64_t *logit_table);
void bpf_forward(bpf_model *m, int32_t first_op, int32_t end_op, const uint32_t *placement,
                 int32_t batch);
int bpf_step(bpf_model *m, const int8_t *x, const int32_t *y, int32_t n, double lr,
             int64_t *loss_sum);
void bpf_reset(bpf_model *m);
#ifdef BPFREE_KERNEL_COUNTS
/* Counter ticks spent in each kernel class since start-up (bpf_forward). */
extern uint32_t bpf_kernel_ticks[K_CLASSES];
#endif
#endif
