/* safetensors reading (mmap, validated header, shards) and writing. */
#ifndef LMX_SAFETENSORS_H
#define LMX_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "lmx.h"

#define LMX_ST_MAX_DIMS 8

typedef struct lmx_st_tensor {
    char *name;            /* owned by the file/set that holds the tensor */
    lmx_dtype dtype;
    int ndim;
    int64_t shape[LMX_ST_MAX_DIMS];
    const void *data;      /* points into the mapping; valid while the set is open */
    size_t nbytes;
    const char *file;      /* path of the file holding it (for error messages) */
} lmx_st_tensor;

/* Validates a whole safetensors file held in memory (buf, len) and lists its
 * tensors, whose data pointers point into buf. `what` names the file in
 * messages. Checks: 8-byte header length inside the file, the header a JSON
 * object, each entry with a known dtype, shape of non-negative ints,
 * data_offsets [begin, end] in bounds with end - begin = product(shape) *
 * dtype size, entries not overlapping; "__metadata__" is skipped.
 * On success *out is a malloc'd array of *n tensors (names malloc'd), sorted
 * by name, each with file == what (not copied: `what` must outlive them);
 * free with lmx_st_free_tensors. Dtypes the format defines but lmx does not
 * run (F64, BOOL, F8_*, ...) fail with LMX_ERR_UNSUPPORTED. */
lmx_status lmx_st_parse(const uint8_t *buf, size_t len, const char *what,
                        lmx_st_tensor **out, size_t *n, lmx_error *err);
void lmx_st_free_tensors(lmx_st_tensor *t, size_t n);

/* All tensors of a checkpoint directory: model.safetensors, or the shards
 * that model.safetensors.index.json names (every shard mapped once; shard
 * names must be plain file names; every tensor the index names must be in
 * its shard; a name may appear in one shard only). */
typedef struct lmx_st_set lmx_st_set;

lmx_status lmx_st_open_dir(const char *dir, lmx_st_set **out, lmx_error *err);
/* Opens one safetensors file as a set. */
lmx_status lmx_st_open_file(const char *path, lmx_st_set **out, lmx_error *err);
void lmx_st_close(lmx_st_set *s);

/* Finds a tensor by exact name; NULL if absent. O(log n). */
const lmx_st_tensor *lmx_st_find(const lmx_st_set *s, const char *name);
size_t lmx_st_count(const lmx_st_set *s);
const lmx_st_tensor *lmx_st_at(const lmx_st_set *s, size_t i); /* sorted by name */
/* Sum of the sizes of the mapped files. */
size_t lmx_st_mapped_bytes(const lmx_st_set *s);

/* Writing: a tensor to write, data from memory. */
typedef struct lmx_st_out {
    const char *name;
    lmx_dtype dtype;
    int ndim;
    int64_t shape[LMX_ST_MAX_DIMS];
    const void *data;      /* NULL: the writer calls fill() instead */
    /* Optional generator for data too large to hold: writes nbytes at dst. */
    void (*fill)(void *ctx, void *dst, size_t nbytes);
    void *fill_ctx;
} lmx_st_out;

/* Writes a safetensors file as torch does: header JSON with
 * "__metadata__": {"format": "pt"} first, then the tensors in the order
 * given, padded with spaces to 8 bytes; then the data back to back, fill()
 * called in chunks of at most 64 MiB. A failed write removes the file. */
lmx_status lmx_st_write(const char *path, const lmx_st_out *t, size_t n, lmx_error *err);

#endif
