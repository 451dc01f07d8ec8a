/* Internal helpers for filling an lmx_error. */
#ifndef LMX_ERROR_H
#define LMX_ERROR_H

#include "lmx.h"

/* Fills *err (if not NULL) and returns code, so callers can write
 * `return lmx_fail(err, LMX_ERR_FORMAT, "%s: ...", path);`. */
lmx_status lmx_fail(lmx_error *err, lmx_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends "prefix: " to an error message already set. */
void lmx_error_prefix(lmx_error *err, const char *prefix);

#endif
