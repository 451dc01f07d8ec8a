#include "fileutil.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "error.h"

lmx_status lmx_read_file(const char *path, char **out, size_t *len, lmx_error *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return lmx_fail(err, LMX_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return lmx_fail(err, LMX_ERR_IO, "%s: not a regular file", path);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, n);
    }
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    if (got != n) {
        free(buf);
        return lmx_fail(err, LMX_ERR_IO, "%s: short read", path);
    }
    buf[n] = 0;
    *out = buf;
    if (len)
        *len = n;
    return LMX_OK;
}

char *lmx_path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (k > 0 && p[k - 1] != '/')
        p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

int lmx_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}
