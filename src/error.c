#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

lmx_status lmx_fail(lmx_error *err, lmx_status code, const char *fmt, ...)
{
    if (err) {
        err->code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return code;
}

void lmx_error_prefix(lmx_error *err, const char *prefix)
{
    if (!err)
        return;
    char tmp[sizeof err->message];
    size_t np = strnlen(prefix, sizeof tmp - 3);
    size_t nm = strnlen(err->message, sizeof tmp - 3 - np);
    memcpy(tmp, prefix, np);
    memcpy(tmp + np, ": ", 2);
    memcpy(tmp + np + 2, err->message, nm);
    tmp[np + 2 + nm] = 0;
    memcpy(err->message, tmp, sizeof tmp);
}

const char *lmx_status_name(lmx_status code)
{
    switch (code) {
    case LMX_OK: return "ok";
    case LMX_ERR_IO: return "io";
    case LMX_ERR_FORMAT: return "format";
    case LMX_ERR_UNSUPPORTED: return "unsupported";
    case LMX_ERR_ARG: return "argument";
    case LMX_ERR_NOMEM: return "out of memory";
    case LMX_ERR_RANGE: return "range";
    case LMX_ERR_CANCELLED: return "cancelled";
    case LMX_ERR_INTERNAL: return "internal";
    }
    return "unknown";
}
