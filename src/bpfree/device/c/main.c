/* Stand-alone driver of a device program: `train` reads samples, runs PMT steps and writes the
 * per-step losses and the trained weights; `infer` writes int8 logits. Files go through stdio:
 * the host's file system, or the debugger host's via semihosting on the emulated MCU. Samples
 * are read batch by batch straight into the arena's input slot (PMT §3.4.1 keeps the training
 * data in external storage), so no copy of the data set occupies SRAM.
 *
 * train.bin: int32 n, numel, steps, batch; float64 lr; int8 x[n * numel]; int32 y[n]
 * infer.bin: int32 n, numel; int8 x[n * numel]
 * With BPFREE_COUNTER defined (the emulated MCU), each step's (or inference call's) count of
 * that counter is written to the file named by the last argument (train: the fifth, infer:
 * the third). Built with BPFREE_KERNEL_COUNTS too, `infer` writes the ticks spent in each
 * kernel class (bpf_kernel_ticks, uint32 each) to the file named by a fourth argument.
 *
 * Nothing read from a file or compiled in with -D is trusted: the -D sizes are checked against
 * the model's own (an edited Makefile or program.json), and each header field and label against
 * them, before any sample reaches a buffer (issue 34). A refusal prints one line naming the
 * value and the allowed ones and exits 1 (2 for an unknown mode). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "bpfree_model.h"
#ifdef BPFREE_KERNEL_COUNTS
#include "bpfree_runtime.h"
#endif

#ifndef BPFREE_MAX_SAMPLES
#define BPFREE_MAX_SAMPLES 256
#endif
#ifndef BPFREE_SAMPLE_BYTES
#define BPFREE_SAMPLE_BYTES 784
#endif
#ifndef BPFREE_CLASSES
#define BPFREE_CLASSES 10
#endif
#ifndef BPFREE_MAX_BATCH
#define BPFREE_MAX_BATCH BPFREE_MAX_SAMPLES
#endif
/* With micro-batches a step's batch may exceed the arena's slot: it is staged here. */
#ifndef BPFREE_MICRO_BATCH
#define BPFREE_MICRO_BATCH 0
#endif
#if BPFREE_MICRO_BATCH
static int8_t staged_x[BPFREE_MAX_SAMPLES * BPFREE_SAMPLE_BYTES];
#define BATCH_CAPACITY BPFREE_MAX_SAMPLES
#else
#define BATCH_CAPACITY BPFREE_MAX_BATCH
#endif

#ifdef BPFREE_COUNTER
uint32_t BPFREE_COUNTER(void);
#endif

static int32_t ys[BPFREE_MAX_SAMPLES];
static int32_t batch_y[BATCH_CAPACITY];
static int8_t logits[BPFREE_MAX_BATCH * BPFREE_CLASSES];

#ifdef __GNUC__
__attribute__((format(printf, 1, 2)))
#endif
static int fail(const char *what, ...);
static int fail(const char *what, ...) {
    va_list args;
    va_start(args, what);
    fputs("bpfree device program: ", stderr);
    vfprintf(stderr, what, args);
    fputc('\n', stderr);
    va_end(args);
    return 1;
}

/* The -D sizes this driver was built with against the model's own: a logits, sample or batch
 * buffer sized by an edited value would be read or written out of bounds. */
static int check_build(void) {
    if (bpfree_classes() != BPFREE_CLASSES)
        return fail("built with BPFREE_CLASSES=%d but the model has %ld outputs; rebuild with "
                    "the program's Makefile", BPFREE_CLASSES, (long)bpfree_classes());
    if (bpfree_sample_bytes() != BPFREE_SAMPLE_BYTES)
        return fail("built with BPFREE_SAMPLE_BYTES=%d but the model takes %ld values a sample; "
                    "rebuild with the program's Makefile", BPFREE_SAMPLE_BYTES,
                    (long)bpfree_sample_bytes());
    if (BPFREE_MAX_BATCH < 1 || BPFREE_MAX_BATCH > bpfree_max_batch())
        return fail("built with BPFREE_MAX_BATCH=%d but the arena holds 1 to %ld samples; "
                    "rebuild with the program's Makefile", BPFREE_MAX_BATCH,
                    (long)bpfree_max_batch());
    if (BPFREE_MICRO_BATCH != bpfree_micro_batch())
        return fail("built with BPFREE_MICRO_BATCH=%d but the model's micro-batch is %ld; "
                    "rebuild with the program's Makefile", BPFREE_MICRO_BATCH,
                    (long)bpfree_micro_batch());
    return 0;
}

/* The file that receives each counted call's ticks: NULL when none is named, or when the
 * build has no counter (the host library). */
static int open_counts(const char *path, FILE **c) {
    *c = NULL;
#ifdef BPFREE_COUNTER
    if (path && !(*c = fopen(path, "wb"))) return fail("cannot open the count file");
#else
    (void)path;
#endif
    return 0;
}

/* Ticks of the counted call between COUNT_START and COUNT_STOP (a down-counter). */
#ifdef BPFREE_COUNTER
#define COUNT_START uint32_t before_ = BPFREE_COUNTER();
#define COUNT_STOP(c) do { uint32_t ticks_ = before_ - BPFREE_COUNTER(); \
    if (c) fwrite(&ticks_, sizeof ticks_, 1, c); } while (0)
#else
#define COUNT_START
#define COUNT_STOP(c) ((void)0)
#endif

static int8_t *batch_buffer(void) {
#if BPFREE_MICRO_BATCH
    return staged_x;
#else
    return bpfree_input();
#endif
}

static int read_samples(FILE *f, long base, int32_t first, int32_t count, int32_t n,
                        int8_t *dst) {
    for (int32_t i = 0; i < count; i++) {
        int32_t k = (first + i) % n;
        if (fseek(f, base + (long)k * BPFREE_SAMPLE_BYTES, SEEK_SET) ||
            fread(dst + (size_t)i * BPFREE_SAMPLE_BYTES, 1, BPFREE_SAMPLE_BYTES, f) !=
                BPFREE_SAMPLE_BYTES)
            return 1;
    }
    return 0;
}

static int train(const char *in_path, const char *out_path, const char *count_path) {
    FILE *f = fopen(in_path, "rb");
    if (!f) return fail("cannot open the training file");
    int32_t head[4];
    double lr;
    if (fread(head, sizeof head, 1, f) != 1 || fread(&lr, sizeof lr, 1, f) != 1)
        return fail("the training file is shorter than its %d-byte header",
                    (int)(sizeof head + sizeof lr));
    int32_t n = head[0], numel = head[1], steps = head[2], batch = head[3];
    if (n < 1 || n > BPFREE_MAX_SAMPLES)
        return fail("the training file holds %ld samples; this program reads 1 to %d "
                    "(BPFREE_MAX_SAMPLES)", (long)n, BPFREE_MAX_SAMPLES);
    if (numel != BPFREE_SAMPLE_BYTES)
        return fail("the training file's samples hold %ld values; the model takes %d "
                    "(BPFREE_SAMPLE_BYTES)", (long)numel, BPFREE_SAMPLE_BYTES);
    if (steps < 0) return fail("steps must be >= 0, got %ld", (long)steps);
    if (batch < 1 || batch > BATCH_CAPACITY)
        return fail("batch must lie in [1, %d], got %ld", BATCH_CAPACITY, (long)batch);
    if (!isfinite(lr) || lr < 0)
        return fail("the learning rate must be finite and >= 0, got %g", lr);
    long base = (long)(sizeof head + sizeof lr);
    if (fseek(f, base + (long)n * numel, SEEK_SET) ||
        fread(ys, sizeof(int32_t), (size_t)n, f) != (size_t)n)
        return fail("the training file is truncated: the labels of its %ld samples are missing",
                    (long)n);
    for (int32_t i = 0; i < n; i++)
        if (ys[i] < 0 || ys[i] >= BPFREE_CLASSES)
            return fail("label %ld of sample %ld lies outside [0, %d]", (long)ys[i], (long)i,
                        BPFREE_CLASSES - 1);
    FILE *o = fopen(out_path, "wb");
    if (!o) return fail("cannot open the output file");
    FILE *c;
    if (open_counts(count_path, &c)) return 1;
    bpfree_init();
    for (int32_t t = 0; t < steps; t++) {
        int8_t *bx = batch_buffer();
        if (read_samples(f, base, (int32_t)(((int64_t)t * batch) % n), batch, n, bx))
            return fail("the training file is truncated: sample data ends early");
        for (int32_t i = 0; i < batch; i++) batch_y[i] = ys[(int32_t)(((int64_t)t * batch + i) % n)];
        int64_t loss;
        COUNT_START
        if (bpfree_step(bx, batch_y, batch, lr, &loss)) return fail("step failed");
        COUNT_STOP(c);
        fwrite(&loss, sizeof loss, 1, o);
    }
    fclose(f);
    if (c) fclose(c);
    return 0 * fclose(o);
}

static int infer(const char *in_path, const char *out_path, const char *count_path,
                 const char *kernel_path) {
    FILE *f = fopen(in_path, "rb");
    if (!f) return fail("cannot open the inference file");
    int32_t head[2];
    if (fread(head, sizeof head, 1, f) != 1)
        return fail("the inference file is shorter than its %d-byte header", (int)sizeof head);
    if (head[0] < 1)
        return fail("the inference file must hold >= 1 sample, got %ld", (long)head[0]);
    if (head[1] != BPFREE_SAMPLE_BYTES)
        return fail("the inference file's samples hold %ld values; the model takes %d "
                    "(BPFREE_SAMPLE_BYTES)", (long)head[1], BPFREE_SAMPLE_BYTES);
    FILE *o = fopen(out_path, "wb");
    if (!o) return fail("cannot open the logits file");
    FILE *c;
    if (open_counts(count_path, &c)) return 1;
    bpfree_init();
    for (int64_t lo = 0; lo < head[0]; lo += BPFREE_MAX_BATCH) {
        int32_t mb = head[0] - lo < BPFREE_MAX_BATCH ? (int32_t)(head[0] - lo) : BPFREE_MAX_BATCH;
        int8_t *x = bpfree_input();
        if (read_samples(f, (long)sizeof head, (int32_t)lo, mb, head[0], x))
            return fail("the inference file is truncated: it declares %ld samples",
                        (long)head[0]);
        COUNT_START
        bpfree_infer(x, mb, logits);
        COUNT_STOP(c);
        fwrite(logits, 1, (size_t)mb * BPFREE_CLASSES, o);
    }
    fclose(f);
    if (c) fclose(c);
#ifdef BPFREE_KERNEL_COUNTS
    FILE *k = kernel_path ? fopen(kernel_path, "wb") : NULL;
    if (kernel_path && !k) return fail("cannot open the kernel count file");
    if (k) fclose((fwrite(bpf_kernel_ticks, sizeof bpf_kernel_ticks, 1, k), k));
#else
    (void)kernel_path;
#endif
    return 0 * fclose(o);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "train";
    if (strcmp(mode, "train") && strcmp(mode, "infer")) {
        fail("unknown mode '%s': the first argument must be train or infer", mode);
        return 2;
    }
    if (check_build()) return 1;
    if (!strcmp(mode, "infer"))
        return infer(argc > 2 ? argv[2] : "infer.bin", argc > 3 ? argv[3] : "logits.bin",
                     argc > 4 ? argv[4] : NULL, argc > 5 ? argv[5] : NULL);
    int rc = train(argc > 2 ? argv[2] : "train.bin", argc > 3 ? argv[3] : "losses.bin",
                   argc > 5 ? argv[5] : NULL);
    if (rc) return rc;
    FILE *o = fopen(argc > 4 ? argv[4] : "weights.bin", "wb");
    if (!o) return fail("cannot open the weights file");
    for (int32_t t = 0; t < bpfree_num_trainable(); t++) {
        fwrite(bpfree_weight(t), 1, (size_t)bpfree_weight_bytes(t), o);
        fwrite(bpfree_bias(t), sizeof(int32_t), (size_t)bpfree_bias_count(t), o);
    }
    return 0 * fclose(o);
}
