/* Weights are used in place from the mapping: after loading a >= 1 GB bf16
 * checkpoint and running tokens through every weight, resident memory stays
 * below 1.2 x the weight bytes (a float32 copy would need 2x). */
#include <stdlib.h>
#include <string.h>

#include "lmx.h"
#include "testutil.h"

static long rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            kb = strtol(line + 6, NULL, 10);
    if (f)
        fclose(f);
    return kb;
}

int main(void)
{
    char dir[512], cmd[1200], *out = NULL;
    snprintf(dir, sizeof dir, "%s/qwen3-0.6b", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s synth --like qwen3-0.6b %s", LMX_BIN, dir);
    CHECK(test_run(cmd, NULL) == 0, "%s", cmd);
    /* the synthetic checkpoint has the real model's parameter count */
    snprintf(cmd, sizeof cmd, "%s info %s", LMX_BIN, dir);
    CHECK(test_run(cmd, &out) == 0 && out && strstr(out, "parameters:        596049920 "),
          "Qwen3-0.6B has 596049920 parameters: %s", out ? out : "");
    free(out);

    lmx_error err = {0};
    long before = rss_kb();
    lmx_model *m = lmx_load(dir, NULL, &err);
    CHECK(m != NULL, "load: %s", err.message);
    if (m) {
        lmx_context *c = lmx_context_new(m, 64, &err);
        CHECK(c != NULL, "context: %s", err.message);
        int32_t ids[8] = {9707, 11, 1879, 0, 42, 7, 100, 151643};
        float *logits = malloc((size_t)lmx_model_vocab_size(m) * sizeof(float));
        CHECK(c && lmx_context_eval(c, ids, 8, logits, 0, &err) == LMX_OK, "eval: %s", err.message);
        CHECK(c && lmx_context_eval(c, ids, 1, logits, 0, &err) == LMX_OK, "decode: %s", err.message);
        long rss = rss_kb() - before;
        double weight_kb = 1192099840.0 / 1024; /* 596049920 bf16 parameters */
        printf("resident after load + eval: %ld kB for %.0f kB of weights (%.2fx)\n", rss, weight_kb,
               rss / weight_kb);
        CHECK(rss > 0.5 * weight_kb, "the eval touched the weights (%ld kB resident)", rss);
        CHECK(rss < 1.2 * weight_kb, "resident %ld kB >= 1.2 x %.0f kB", rss, weight_kb);
        free(logits);
        lmx_context_free(c);
        lmx_close(m);
    }
    return test_finish();
}
