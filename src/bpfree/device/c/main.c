/* Stand-alone driver of a device program: `train` reads samples, runs PMT steps and writes the
 * per-step losses and the trained weights; `infer` writes int8 logits. Files go through stdio:
 * the host's file system, or the debugger host's via semihosting on the emulated MCU.
 *
 * train.bin: int32 n, numel, steps, batch; float64 lr; int8 x[n * numel]; int32 y[n]
 * infer.bin: int32 n, numel; int8 x[n * numel] */
#include <stdio.h>
#include <string.h>
#include "bpfree_model.h"

#ifndef BPFREE_MAX_SAMPLES
#define BPFREE_MAX_SAMPLES 256
#endif
#ifndef BPFREE_SAMPLE_BYTES
#define BPFREE_SAMPLE_BYTES 784
#endif
#ifndef BPFREE_CLASSES
#define BPFREE_CLASSES 10
#endif

static int8_t xs[BPFREE_MAX_SAMPLES * BPFREE_SAMPLE_BYTES];
static int32_t ys[BPFREE_MAX_SAMPLES];
static int8_t batch_x[BPFREE_MAX_SAMPLES * BPFREE_SAMPLE_BYTES];
static int32_t batch_y[BPFREE_MAX_SAMPLES];
static int8_t logits[BPFREE_MAX_SAMPLES * BPFREE_CLASSES];

static int fail(const char *what) {
    fprintf(stderr, "bpfree device program: %s\n", what);
    return 1;
}

static int train(const char *in_path, const char *out_path) {
    FILE *f = fopen(in_path, "rb");
    if (!f) return fail("cannot open the training file");
    int32_t head[4];
    double lr;
    if (fread(head, sizeof head, 1, f) != 1 || fread(&lr, sizeof lr, 1, f) != 1) return fail("bad header");
    int32_t n = head[0], numel = head[1], steps = head[2], batch = head[3];
    if (n < 1 || n > BPFREE_MAX_SAMPLES || numel != BPFREE_SAMPLE_BYTES || batch < 1 ||
        batch > BPFREE_MAX_SAMPLES)
        return fail("samples do not match the program (count, size or batch)");
    if (fread(xs, 1, (size_t)n * numel, f) != (size_t)n * numel ||
        fread(ys, sizeof(int32_t), (size_t)n, f) != (size_t)n)
        return fail("truncated training file");
    fclose(f);
    FILE *o = fopen(out_path, "wb");
    if (!o) return fail("cannot open the output file");
    bpfree_init();
    for (int32_t t = 0; t < steps; t++) {
        for (int32_t i = 0; i < batch; i++) {
            int32_t k = (int32_t)(((int64_t)t * batch + i) % n);
            memcpy(batch_x + (size_t)i * numel, xs + (size_t)k * numel, (size_t)numel);
            batch_y[i] = ys[k];
        }
        int64_t loss;
        if (bpfree_step(batch_x, batch_y, batch, lr, &loss)) return fail("step failed");
        fwrite(&loss, sizeof loss, 1, o);
    }
    return 0 * fclose(o);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "train";
    if (!strcmp(mode, "infer")) {
        FILE *f = fopen(argc > 2 ? argv[2] : "infer.bin", "rb");
        if (!f) return fail("cannot open the inference file");
        int32_t head[2];
        if (fread(head, sizeof head, 1, f) != 1 || head[0] < 1 || head[0] > BPFREE_MAX_SAMPLES ||
            head[1] != BPFREE_SAMPLE_BYTES)
            return fail("samples do not match the program");
        if (fread(xs, 1, (size_t)head[0] * head[1], f) != (size_t)head[0] * head[1])
            return fail("truncated inference file");
        fclose(f);
        bpfree_init();
        bpfree_infer(xs, head[0], logits);
        FILE *o = fopen(argc > 3 ? argv[3] : "logits.bin", "wb");
        if (!o) return fail("cannot open the logits file");
        fwrite(logits, 1, (size_t)head[0] * BPFREE_CLASSES, o);
        return 0 * fclose(o);
    }
    int rc = train(argc > 2 ? argv[2] : "train.bin", argc > 3 ? argv[3] : "losses.bin");
    if (rc) return rc;
    FILE *o = fopen(argc > 4 ? argv[4] : "weights.bin", "wb");
    if (!o) return fail("cannot open the weights file");
    for (int32_t t = 0; t < bpfree_num_trainable(); t++) {
        fwrite(bpfree_weight(t), 1, (size_t)bpfree_weight_bytes(t), o);
        fwrite(bpfree_bias(t), sizeof(int32_t), (size_t)bpfree_bias_count(t), o);
    }
    return 0 * fclose(o);
}
