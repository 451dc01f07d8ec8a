#include "args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int args_int(const char *s, long lo, long hi, const char *what, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "lmx: %s must be an integer in [%ld, %ld], got '%s'\n", what, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int args_float(const char *s, double lo, double hi, const char *what, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "lmx: %s must be a number in [%g, %g], got '%s'\n", what, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int args_ids(const char *s, int32_t **ids, size_t *n)
{
    size_t cap = 16, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    const char *p = s;
    while (v && *p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (errno || end == p || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "lmx: --ids: '%s' is not a comma-separated list of token ids\n", s);
            free(v);
            return -1;
        }
        if (k == cap) {
            int32_t *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv)
                free(v);
            v = nv;
            if (!v)
                break;
        }
        v[k++] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    if (!v) {
        fprintf(stderr, "lmx: out of memory\n");
        return -1;
    }
    if (k == 0) {
        fprintf(stderr, "lmx: --ids: no token ids given\n");
        free(v);
        return -1;
    }
    *ids = v;
    *n = k;
    return 0;
}

const char *args_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "lmx: %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int args_tokenizer_present(const char *cmd, const char *dir)
{
    char path[4096];
    if (access(dir, F_OK) != 0 || snprintf(path, sizeof path, "%s/tokenizer.json", dir) >= (int)sizeof path ||
        access(path, F_OK) == 0)
        return 0;
    fprintf(stderr, "lmx %s: %s: not found; text generation needs the model's tokenizer\n", cmd, path);
    return -1;
}
