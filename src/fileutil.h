/* Small file helpers shared by the parsers. */
#ifndef LMX_FILEUTIL_H
#define LMX_FILEUTIL_H

#include <stddef.h>

#include "lmx.h"

/* Reads a whole file into a malloc'd, NUL-terminated buffer (caller frees). */
lmx_status lmx_read_file(const char *path, char **out, size_t *len, lmx_error *err);
/* Joins dir and name with one '/' into a malloc'd string (caller frees). */
char *lmx_path_join(const char *dir, const char *name);
int lmx_file_exists(const char *path);

#endif
