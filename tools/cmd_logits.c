/* lmx logits: the logits at every position of a list of token ids, written
 * as a safetensors file with one F32 tensor "logits" [L, V]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "genopts.h"
#include "lmx.h"
#include "safetensors.h"

static int usage(void)
{
    fprintf(stderr, "usage: lmx logits DIR --ids 1,2,3 --out FILE.safetensors [--decode] [--chunk N] [--threads T]\n"
                    "       [--device cpu|cuda] [--gpus N] [--quant q8|q4] [--kv f32|f16]\n");
    return 2;
}

int cmd_logits(int argc, char **argv)
{
    const char *dir = NULL, *out = NULL, *ids_arg = NULL;
    long chunk = 0, threads = 0, gpus = 0;
    int decode = 0, device = LMX_DEVICE_AUTO, quant = 0, kv_f16 = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--ids")) {
            if (!(ids_arg = args_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(argv[i], "--out")) {
            if (!(out = args_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(argv[i], "--decode")) {
            decode = 1;
        } else if (!strcmp(argv[i], "--chunk")) {
            if (!(v = args_value(argc, argv, &i)) || args_int(v, 1, 1 << 20, "--chunk", &chunk))
                return 2;
        } else if (!strcmp(argv[i], "--device")) {
            if (!(v = args_value(argc, argv, &i)) || genopts_device(v, &device))
                return 2;
        } else if (!strcmp(argv[i], "--gpus")) {
            if (!(v = args_value(argc, argv, &i)) || args_int(v, 1, 8, "--gpus", &gpus))
                return 2;
        } else if (!strcmp(argv[i], "--threads")) {
            if (!(v = args_value(argc, argv, &i)) || args_int(v, 0, 1024, "--threads", &threads))
                return 2;
        } else if (!strcmp(argv[i], "--quant")) {
            if (!(v = args_value(argc, argv, &i)) || genopts_quant(v, &quant))
                return 2;
        } else if (!strcmp(argv[i], "--kv")) {
            if (!(v = args_value(argc, argv, &i)) || genopts_kv(v, &kv_f16))
                return 2;
        } else if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "lmx logits: unexpected argument '%s'\n", argv[i]);
            return usage();
        } else {
            dir = argv[i];
        }
    }
    if (!dir || !out || !ids_arg)
        return usage();
    int32_t *ids;
    size_t n;
    if (args_ids(ids_arg, &ids, &n))
        return 2;
    if (decode)
        chunk = 1;
    lmx_error err = {0};
    lmx_load_options opts = lmx_load_defaults();
    opts.n_threads = (int)threads;
    opts.device = device;
    opts.n_gpus = (int)gpus;
    opts.quant = quant;
    opts.kv_f16 = kv_f16;
    lmx_model *m = lmx_load(dir, &opts, &err);
    lmx_context *c = NULL;
    float *logits = NULL;
    int rc = 1;
    if (!m)
        goto fail;
    int V = lmx_model_vocab_size(m);
    if (n > (size_t)lmx_model_max_context(m)) {
        snprintf(err.message, sizeof err.message, "%zu ids exceed the model's %d positions", n,
                 lmx_model_max_context(m));
        goto fail;
    }
    if (!(c = lmx_context_new(m, (int)n, &err)))
        goto fail;
    if (!(logits = malloc(n * (size_t)V * sizeof(float)))) {
        snprintf(err.message, sizeof err.message, "cannot allocate %zu x %d logits", n, V);
        goto fail;
    }
    size_t step = chunk ? (size_t)chunk : n;
    for (size_t i = 0; i < n; i += step) {
        size_t k = n - i < step ? n - i : step;
        if (lmx_context_eval(c, ids + i, (int)k, logits + i * (size_t)V, 1, &err))
            goto fail;
    }
    lmx_st_out t = {.name = "logits", .dtype = LMX_DT_F32, .ndim = 2, .shape = {(int64_t)n, V}, .data = logits};
    if (lmx_st_write(out, &t, 1, &err))
        goto fail;
    rc = 0;
fail:
    if (rc)
        fprintf(stderr, "lmx: %s\n", err.message);
    free(logits);
    free(ids);
    lmx_context_free(c);
    lmx_close(m);
    return rc;
}
