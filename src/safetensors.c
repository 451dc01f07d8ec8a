#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "fileutil.h"

/* The reference implementation refuses headers above 100 MB; so do we, so a
 * corrupt length cannot make us copy and parse an absurd amount. */
#define ST_MAX_HEADER (100u * 1024u * 1024u)
/* Integers above 2^53 are not exact in the doubles cJSON stores. */
#define ST_MAX_INT 9007199254740992.0
/* The writer's fill() chunk: bounded memory for multi-GB checkpoints. */
#define ST_FILL_CHUNK ((size_t)64 << 20)

static const char INDEX_NAME[] = "model.safetensors.index.json";
static const char SINGLE_NAME[] = "model.safetensors";

/* dtypes the safetensors format defines but lmx does not run: named as
 * "unsupported" rather than "malformed". */
static const char *const foreign_dtypes[] = {
    "BOOL", "F64", "I64", "U64", "I16", "U16", "F8_E4M3", "F8_E5M2", "F8_E8M0",
    "F6_E2M3", "F6_E3M2", "F4", "C64",
};

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const lmx_st_tensor *)a)->name, ((const lmx_st_tensor *)b)->name);
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

void lmx_st_free_tensors(lmx_st_tensor *t, size_t n)
{
    if (!t)
        return;
    for (size_t i = 0; i < n; i++)
        free(t[i].name);
    free(t);
}

/* ---- parsing ------------------------------------------------------------ */

/* A JSON number that is a non-negative integer exactly held by a double. */
static int json_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v))
        return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d < ST_MAX_INT) || (double)(uint64_t)d != d)
        return -1;
    *out = (uint64_t)d;
    return 0;
}

/* Describes a JSON value for a message: the number itself, or its kind. */
static const char *json_show(const cJSON *v, char *buf, size_t cap)
{
    if (cJSON_IsNumber(v))
        snprintf(buf, cap, "%.17g", v->valuedouble);
    else if (cJSON_IsString(v))
        snprintf(buf, cap, "a string");
    else if (cJSON_IsArray(v))
        snprintf(buf, cap, "an array");
    else if (cJSON_IsObject(v))
        snprintf(buf, cap, "an object");
    else if (cJSON_IsBool(v))
        snprintf(buf, cap, "a boolean");
    else
        snprintf(buf, cap, "null");
    return buf;
}

static const char *shape_str(const int64_t *shape, int ndim, char *buf, size_t cap)
{
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < cap)
        snprintf(buf + k, cap - k, "]");
    return buf;
}

static int is_foreign_dtype(const char *s)
{
    for (size_t i = 0; i < sizeof foreign_dtypes / sizeof foreign_dtypes[0]; i++)
        if (strcmp(s, foreign_dtypes[i]) == 0)
            return 1;
    return 0;
}

static lmx_status check_metadata(const cJSON *meta, const char *what, lmx_error *err)
{
    if (!cJSON_IsObject(meta))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: \"__metadata__\" is not an object", what);
    for (const cJSON *e = meta->child; e; e = e->next)
        if (!cJSON_IsString(e))
            return lmx_fail(err, LMX_ERR_FORMAT, "%s: \"__metadata__\" entry '%s' is not a string",
                            what, e->string);
    return LMX_OK;
}

/* Fills t (name excepted) from one header entry; data_len bytes follow the
 * header at data. */
static lmx_status parse_entry(const cJSON *e, const uint8_t *data, uint64_t data_len,
                              const char *what, lmx_st_tensor *t, lmx_error *err)
{
    const char *nm = e->string;
    char vb[64], sb[256];
    if (!cJSON_IsObject(e))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: tensor '%s': entry is not an object", what, nm);

    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    if (!cJSON_IsString(dt))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: tensor '%s': \"dtype\" missing or not a string",
                        what, nm);
    if (lmx_dtype_parse(dt->valuestring, &t->dtype) != 0) {
        if (is_foreign_dtype(dt->valuestring))
            return lmx_fail(err, LMX_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s is not supported",
                            what, nm, dt->valuestring);
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: tensor '%s': unknown dtype \"%s\"", what, nm,
                        dt->valuestring);
    }

    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    if (!cJSON_IsArray(sh))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: tensor '%s': \"shape\" missing or not an array",
                        what, nm);
    int nd = cJSON_GetArraySize(sh);
    if (nd > LMX_ST_MAX_DIMS)
        return lmx_fail(err, LMX_ERR_UNSUPPORTED, "%s: tensor '%s': shape has %d dims, at most %d",
                        what, nm, nd, LMX_ST_MAX_DIMS);
    t->ndim = nd;
    /* The product of the non-zero dims must fit, so code that multiplies a
     * prefix of the shape cannot overflow even when a later dim is 0. */
    uint64_t nz_product = 1, elems = 1;
    int d = 0;
    for (const cJSON *v = sh->child; v; v = v->next, d++) {
        uint64_t x;
        if (json_uint(v, &x) != 0)
            return lmx_fail(err, LMX_ERR_FORMAT,
                            "%s: tensor '%s': shape[%d] is %s, not a non-negative integer", what,
                            nm, d, json_show(v, vb, sizeof vb));
        t->shape[d] = (int64_t)x;
        if (x != 0 && nz_product > (uint64_t)INT64_MAX / x)
            return lmx_fail(err, LMX_ERR_FORMAT, "%s: tensor '%s': shape %s overflows", what, nm,
                            shape_str(t->shape, d + 1, sb, sizeof sb));
        if (x != 0)
            nz_product *= x;
        elems = x == 0 ? 0 : elems * x;
    }
    size_t esize = lmx_dtype_size(t->dtype);
    if (elems > (uint64_t)INT64_MAX / esize)
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: tensor '%s': shape %s of %s overflows in bytes",
                        what, nm, shape_str(t->shape, nd, sb, sizeof sb), dt->valuestring);
    uint64_t need = elems * esize;

    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
        return lmx_fail(err, LMX_ERR_FORMAT,
                        "%s: tensor '%s': \"data_offsets\" missing or not a [begin, end] pair",
                        what, nm);
    uint64_t begin, end;
    if (json_uint(off->child, &begin) != 0 || json_uint(off->child->next, &end) != 0)
        return lmx_fail(err, LMX_ERR_FORMAT,
                        "%s: tensor '%s': \"data_offsets\" are not non-negative integers", what,
                        nm);
    if (begin > end)
        return lmx_fail(err, LMX_ERR_FORMAT,
                        "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin", what,
                        nm, (unsigned long long)begin, (unsigned long long)end);
    if (end > data_len)
        return lmx_fail(err, LMX_ERR_FORMAT,
                        "%s: tensor '%s': data_offsets [%llu, %llu] exceed the data section of "
                        "%llu bytes",
                        what, nm, (unsigned long long)begin, (unsigned long long)end,
                        (unsigned long long)data_len);
    if (end - begin != need)
        return lmx_fail(err, LMX_ERR_FORMAT,
                        "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but shape %s "
                        "of %s needs %llu",
                        what, nm, (unsigned long long)begin, (unsigned long long)end,
                        (unsigned long long)(end - begin), shape_str(t->shape, nd, sb, sizeof sb),
                        dt->valuestring, (unsigned long long)need);
    t->data = data + begin;
    t->nbytes = (size_t)need;
    return LMX_OK;
}

typedef struct st_range {
    size_t begin, end;
    const char *name;
} st_range;

static int cmp_range(const void *a, const void *b)
{
    const st_range *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

/* Tensors must not share bytes; empty tensors hold none. */
static lmx_status check_overlap(const lmx_st_tensor *t, size_t n, const uint8_t *data,
                                const char *what, lmx_error *err)
{
    st_range *r = malloc((n ? n : 1) * sizeof *r);
    if (!r)
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (t[i].nbytes) {
            size_t b = (size_t)((const uint8_t *)t[i].data - data);
            r[m++] = (st_range){b, b + t[i].nbytes, t[i].name};
        }
    qsort(r, m, sizeof *r, cmp_range);
    lmx_status st = LMX_OK;
    size_t last = 0; /* the range reaching furthest so far */
    for (size_t i = 1; i < m && st == LMX_OK; i++) {
        if (r[i].begin < r[last].end)
            st = lmx_fail(err, LMX_ERR_FORMAT,
                          "%s: tensors '%s' [%zu, %zu] and '%s' [%zu, %zu] overlap", what,
                          r[last].name, r[last].begin, r[last].end, r[i].name, r[i].begin,
                          r[i].end);
        if (r[i].end > r[last].end)
            last = i;
    }
    free(r);
    return st;
}

lmx_status lmx_st_parse(const uint8_t *buf, size_t len, const char *what, lmx_st_tensor **out,
                        size_t *n, lmx_error *err)
{
    *out = NULL;
    *n = 0;
    if (len < 8)
        return lmx_fail(err, LMX_ERR_FORMAT,
                        "%s: file is %zu bytes, shorter than the 8-byte header length", what, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | buf[i];
    if (hlen > len - 8)
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: header length %llu exceeds file size %zu",
                        what, (unsigned long long)hlen, len);
    if (hlen > ST_MAX_HEADER)
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: header length %llu is over the %u-byte limit",
                        what, (unsigned long long)hlen, ST_MAX_HEADER);

    /* A NUL-terminated copy: cJSON then cannot read past the header even
     * if it overruns the length it is given. */
    char *text = malloc(hlen + 1);
    if (!text)
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory for the header", what);
    memcpy(text, buf + 8, hlen);
    text[hlen] = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, hlen, &end, 0);
    lmx_status st = LMX_OK;
    if (!root) {
        st = lmx_fail(err, LMX_ERR_FORMAT, "%s: header is not valid JSON (at byte %zu)", what,
                      end ? (size_t)(end - text) : (size_t)0);
    } else {
        /* Only whitespace may pad the header after the JSON value. */
        for (const char *p = end; p < text + hlen; p++)
            if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
                st = lmx_fail(err, LMX_ERR_FORMAT,
                              "%s: header has bytes after the JSON value (at byte %zu)", what,
                              (size_t)(p - text));
                break;
            }
    }
    if (st == LMX_OK && !cJSON_IsObject(root))
        st = lmx_fail(err, LMX_ERR_FORMAT, "%s: header is not a JSON object", what);

    const uint8_t *data = buf + 8 + hlen;
    uint64_t data_len = len - 8 - hlen;
    size_t cap = 0, cnt = 0;
    lmx_st_tensor *t = NULL;
    if (st == LMX_OK) {
        for (const cJSON *e = root->child; e; e = e->next)
            cap++;
        t = calloc(cap ? cap : 1, sizeof *t);
        if (!t)
            st = lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory for %zu tensors", what, cap);
    }
    for (const cJSON *e = st == LMX_OK ? root->child : NULL; e && st == LMX_OK; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            st = check_metadata(e, what, err);
            continue;
        }
        lmx_st_tensor *x = &t[cnt];
        st = parse_entry(e, data, data_len, what, x, err);
        if (st != LMX_OK)
            break;
        x->file = what;
        x->name = strdup(e->string);
        if (!x->name) {
            st = lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
            break;
        }
        cnt++;
    }
    cJSON_Delete(root);
    free(text);

    if (st == LMX_OK) {
        qsort(t, cnt, sizeof *t, cmp_tensor_name);
        for (size_t i = 1; i < cnt && st == LMX_OK; i++)
            if (strcmp(t[i - 1].name, t[i].name) == 0)
                st = lmx_fail(err, LMX_ERR_FORMAT, "%s: tensor '%s' appears twice in the header",
                              what, t[i].name);
    }
    if (st == LMX_OK)
        st = check_overlap(t, cnt, data, what, err);
    if (st != LMX_OK) {
        lmx_st_free_tensors(t, cnt);
        return st;
    }
    *out = t;
    *n = cnt;
    return LMX_OK;
}

/* ---- sets of mapped files ----------------------------------------------- */

typedef struct st_shard {
    char *path; /* owned */
    void *map;  /* owned mapping of len bytes, NULL if not mapped */
    size_t len;
} st_shard;

struct lmx_st_set {
    st_shard *shards; /* owned, nshards */
    size_t nshards;
    lmx_st_tensor *t; /* owned, sorted by name; file points at a shard's path */
    size_t n;
};


void lmx_st_close(lmx_st_set *s)
{
    if (!s)
        return;
    lmx_st_free_tensors(s->t, s->n);
    for (size_t i = 0; i < s->nshards; i++) {
        if (s->shards[i].map)
            munmap(s->shards[i].map, s->shards[i].len);
        free(s->shards[i].path);
    }
    free(s->shards);
    free(s);
}

/* Maps path as the next shard of s (room for it is allocated) and appends
 * its tensors to s->t. On failure s stays consistent for lmx_st_close. */
static lmx_status set_add_file(lmx_st_set *s, const char *path, lmx_error *err)
{
    st_shard *sh = &s->shards[s->nshards];
    sh->path = strdup(path);
    if (!sh->path)
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", path);
    s->nshards++;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return lmx_fail(err, LMX_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return lmx_fail(err, LMX_ERR_IO, "%s: not a regular file", path);
    }
    if (sb.st_size < 8) {
        close(fd);
        return lmx_fail(err, LMX_ERR_FORMAT,
                        "%s: file is %lld bytes, shorter than the 8-byte header length", path,
                        (long long)sb.st_size);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return lmx_fail(err, LMX_ERR_UNSUPPORTED, "%s: file too large to map", path);
    }
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd); /* the mapping keeps the file */
    if (m == MAP_FAILED)
        return lmx_fail(err, LMX_ERR_IO, "%s: cannot map: %s", path, strerror(map_errno));
    sh->map = m;
    sh->len = (size_t)sb.st_size;

    lmx_st_tensor *t;
    size_t n;
    lmx_status st = lmx_st_parse(m, sh->len, sh->path, &t, &n, err);
    if (st != LMX_OK)
        return st;
    lmx_st_tensor *all = realloc(s->t, (s->n + n ? s->n + n : 1) * sizeof *all);
    if (!all) {
        lmx_st_free_tensors(t, n);
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", path);
    }
    memcpy(all + s->n, t, n * sizeof *t); /* names now owned by the set */
    free(t);
    s->t = all;
    s->n += n;
    return LMX_OK;
}

/* Sorts the merged tensors by name; a name may live in one shard only. */
static lmx_status set_finish(lmx_st_set *s, lmx_error *err)
{
    qsort(s->t, s->n, sizeof *s->t, cmp_tensor_name);
    for (size_t i = 1; i < s->n; i++)
        if (strcmp(s->t[i - 1].name, s->t[i].name) == 0)
            return lmx_fail(err, LMX_ERR_FORMAT, "tensor '%s' is in both %s and %s", s->t[i].name,
                            s->t[i - 1].file, s->t[i].file);
    return LMX_OK;
}

static lmx_st_set *set_new(size_t nshards)
{
    lmx_st_set *s = calloc(1, sizeof *s);
    if (s)
        s->shards = calloc(nshards ? nshards : 1, sizeof *s->shards);
    if (s && !s->shards) {
        free(s);
        s = NULL;
    }
    return s;
}

lmx_status lmx_st_open_file(const char *path, lmx_st_set **out, lmx_error *err)
{
    *out = NULL;
    lmx_st_set *s = set_new(1);
    if (!s)
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", path);
    lmx_status st = set_add_file(s, path, err);
    if (st == LMX_OK)
        st = set_finish(s, err);
    if (st != LMX_OK) {
        lmx_st_close(s);
        return st;
    }
    *out = s;
    return LMX_OK;
}

/* A shard must sit beside the index: no directories, no way out of it. */
static int plain_file_name(const char *n)
{
    return n[0] && strcmp(n, ".") != 0 && !strchr(n, '/') && !strstr(n, "..");
}

static lmx_status open_index(const char *dir, const char *index, lmx_st_set **out,
                             lmx_error *err)
{
    char *text;
    size_t len;
    lmx_status st = lmx_read_file(index, &text, &len, err);
    if (st != LMX_OK)
        return st;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root)
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: not valid JSON", index);

    const char **names = NULL; /* point into root */
    lmx_st_set *s = NULL;
    size_t cnt = 0, u = 0;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        st = lmx_fail(err, LMX_ERR_FORMAT, "%s: \"weight_map\" missing or not an object", index);
        goto done;
    }
    for (const cJSON *e = wm->child; e; e = e->next)
        cnt++;
    if (cnt == 0) {
        st = lmx_fail(err, LMX_ERR_FORMAT, "%s: \"weight_map\" names no tensors", index);
        goto done;
    }
    names = malloc(cnt * sizeof *names);
    if (!names) {
        st = lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", index);
        goto done;
    }
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e)) {
            st = lmx_fail(err, LMX_ERR_FORMAT, "%s: weight_map entry '%s' is not a string", index,
                          e->string);
            goto done;
        }
        if (!plain_file_name(e->valuestring)) {
            st = lmx_fail(err, LMX_ERR_FORMAT,
                          "%s: tensor '%s': shard '%s' is not a plain file name", index,
                          e->string, e->valuestring);
            goto done;
        }
        names[u++] = e->valuestring;
    }
    qsort(names, cnt, sizeof *names, cmp_str_ptr);
    u = 0;
    for (size_t i = 0; i < cnt; i++)
        if (u == 0 || strcmp(names[u - 1], names[i]) != 0)
            names[u++] = names[i];

    s = set_new(u);
    if (!s) {
        st = lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", index);
        goto done;
    }
    for (size_t i = 0; i < u && st == LMX_OK; i++) {
        char *path = lmx_path_join(dir, names[i]);
        st = path ? set_add_file(s, path, err)
                  : lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", index);
        free(path);
    }
    if (st == LMX_OK)
        st = set_finish(s, err);
    if (st != LMX_OK) {
        lmx_error_prefix(err, index);
        goto done;
    }
    for (const cJSON *e = wm->child; e; e = e->next) {
        const char *key = e->valuestring;
        const char **k = bsearch(&key, names, u, sizeof *names, cmp_str_ptr);
        const lmx_st_tensor *t = lmx_st_find(s, e->string);
        if (!t || t->file != s->shards[k - names].path) {
            st = lmx_fail(err, LMX_ERR_FORMAT,
                          "%s: tensor '%s' is mapped to shard '%s', which does not hold it", index,
                          e->string, e->valuestring);
            goto done;
        }
    }
done:
    free(names);
    cJSON_Delete(root);
    if (st != LMX_OK) {
        lmx_st_close(s);
        return st;
    }
    *out = s;
    return LMX_OK;
}

lmx_status lmx_st_open_dir(const char *dir, lmx_st_set **out, lmx_error *err)
{
    *out = NULL;
    char *index = lmx_path_join(dir, INDEX_NAME);
    char *single = lmx_path_join(dir, SINGLE_NAME);
    lmx_status st;
    if (!index || !single)
        st = lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", dir);
    else if (lmx_file_exists(index))
        st = open_index(dir, index, out, err);
    else if (lmx_file_exists(single))
        st = lmx_st_open_file(single, out, err);
    else
        st = lmx_fail(err, LMX_ERR_IO, "%s: no %s or %s", dir, SINGLE_NAME, INDEX_NAME);
    free(index);
    free(single);
    return st;
}

const lmx_st_tensor *lmx_st_find(const lmx_st_set *s, const char *name)
{
    if (!s || !name)
        return NULL;
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, s->t[mid].name);
        if (c == 0)
            return &s->t[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

size_t lmx_st_count(const lmx_st_set *s) { return s ? s->n : 0; }

const lmx_st_tensor *lmx_st_at(const lmx_st_set *s, size_t i)
{
    return s && i < s->n ? &s->t[i] : NULL;
}

size_t lmx_st_mapped_bytes(const lmx_st_set *s)
{
    size_t sum = 0;
    for (size_t i = 0; s && i < s->nshards; i++)
        sum += s->shards[i].len;
    return sum;
}

/* ---- writing ------------------------------------------------------------ */

/* Bytes of one tensor to write, or an error naming it. */
static lmx_status out_nbytes(const lmx_st_out *o, const char *path, uint64_t *nb, lmx_error *err)
{
    if (!o->name || strcmp(o->name, "__metadata__") == 0)
        return lmx_fail(err, LMX_ERR_ARG, "%s: a tensor has no name or a reserved one", path);
    if ((unsigned)o->dtype >= LMX_DT_COUNT)
        return lmx_fail(err, LMX_ERR_ARG, "%s: tensor '%s': bad dtype %d", path, o->name,
                        (int)o->dtype);
    if (o->ndim < 0 || o->ndim > LMX_ST_MAX_DIMS)
        return lmx_fail(err, LMX_ERR_ARG, "%s: tensor '%s': %d dims, at most %d", path, o->name,
                        o->ndim, LMX_ST_MAX_DIMS);
    uint64_t n = lmx_dtype_size(o->dtype);
    for (int d = 0; d < o->ndim; d++) {
        int64_t x = o->shape[d];
        if (x < 0 || (x > 0 && n > (uint64_t)ST_MAX_INT / (uint64_t)x))
            return lmx_fail(err, LMX_ERR_ARG, "%s: tensor '%s': shape[%d] = %lld is out of range",
                            path, o->name, d, (long long)x);
        n *= (uint64_t)x;
    }
    if (n && !o->data && !o->fill)
        return lmx_fail(err, LMX_ERR_ARG, "%s: tensor '%s': neither data nor fill given", path,
                        o->name);
    *nb = n;
    return LMX_OK;
}

/* The header JSON as torch writes it: metadata first, then the tensors in
 * the order given, offsets packed back to back. Caller frees with free(). */
static lmx_status build_header(const char *path, const lmx_st_out *t, size_t n, char **out,
                               lmx_error *err)
{
    *out = NULL;
    const char **names = malloc((n ? n : 1) * sizeof *names);
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    lmx_status st = LMX_OK;
    if (!names || !meta || !cJSON_AddStringToObject(meta, "format", "pt"))
        st = lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", path);
    uint64_t off = 0;
    for (size_t i = 0; i < n && st == LMX_OK; i++) {
        uint64_t nb;
        st = out_nbytes(&t[i], path, &nb, err);
        if (st != LMX_OK)
            break;
        names[i] = t[i].name;
        /* cJSON prints integers exactly (without an exponent) below 1e15. */
        if (off + nb >= 1e15) {
            st = lmx_fail(err, LMX_ERR_ARG, "%s: more than 1e15 bytes of tensor data", path);
            break;
        }
        cJSON *e = cJSON_AddObjectToObject(root, t[i].name);
        int ok = cJSON_AddStringToObject(e, "dtype", lmx_dtype_name(t[i].dtype)) != NULL;
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        ok = ok && shape && offs;
        for (int d = 0; ok && d < t[i].ndim; d++)
            ok = cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t[i].shape[d]));
        ok = ok && cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off)) &&
             cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + nb)));
        if (!ok)
            st = lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", path);
        off += nb;
    }
    if (st == LMX_OK) {
        qsort(names, n, sizeof *names, cmp_str_ptr);
        for (size_t i = 1; i < n && st == LMX_OK; i++)
            if (strcmp(names[i - 1], names[i]) == 0)
                st = lmx_fail(err, LMX_ERR_ARG, "%s: tensor '%s' given twice", path, names[i]);
    }
    if (st == LMX_OK) {
        *out = cJSON_PrintUnformatted(root);
        if (!*out)
            st = lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", path);
    }
    free(names);
    cJSON_Delete(root);
    return st;
}

static lmx_status write_all(FILE *f, const char *path, const char *hdr, const lmx_st_out *t,
                            size_t n, lmx_error *err)
{
    size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(hdr, 1, hlen, f) == hlen;
    for (size_t i = hlen; ok && i < padded; i++)
        ok = fputc(' ', f) != EOF;

    uint8_t *chunk = NULL; /* for fill(): grown up to ST_FILL_CHUNK bytes */
    size_t chunk_cap = 0;
    for (size_t i = 0; ok && i < n; i++) {
        uint64_t nb;
        out_nbytes(&t[i], path, &nb, NULL); /* already validated */
        if (t[i].data) {
            ok = fwrite(t[i].data, 1, (size_t)nb, f) == nb;
            continue;
        }
        size_t want = nb < ST_FILL_CHUNK ? (size_t)nb : ST_FILL_CHUNK;
        if (want > chunk_cap) {
            uint8_t *c = realloc(chunk, want);
            if (!c) {
                free(chunk);
                return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", path);
            }
            chunk = c;
            chunk_cap = want;
        }
        for (uint64_t done = 0; ok && done < nb;) {
            size_t k = nb - done < chunk_cap ? (size_t)(nb - done) : chunk_cap;
            t[i].fill(t[i].fill_ctx, chunk, k);
            ok = fwrite(chunk, 1, k, f) == k;
            done += k;
        }
    }
    free(chunk);
    if (!ok)
        return lmx_fail(err, LMX_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return LMX_OK;
}

lmx_status lmx_st_write(const char *path, const lmx_st_out *t, size_t n, lmx_error *err)
{
    if (!path || (n && !t))
        return lmx_fail(err, LMX_ERR_ARG, "lmx_st_write: NULL path or tensors");
    char *hdr;
    lmx_status st = build_header(path, t, n, &hdr, err);
    if (st != LMX_OK)
        return st;
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(hdr);
        return lmx_fail(err, LMX_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    st = write_all(f, path, hdr, t, n, err);
    free(hdr);
    if (fclose(f) != 0 && st == LMX_OK)
        st = lmx_fail(err, LMX_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    if (st != LMX_OK)
        remove(path); /* no half-written checkpoint left behind */
    return st;
}
