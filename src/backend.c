#include "backend.h"

#include <stdint.h>

#include "error.h"

lmx_status lmx_backend_weight_view(const lmx_st_tensor *t, int *rows, int *cols, lmx_error *err)
{
    if (t->dtype != LMX_DT_F32 && t->dtype != LMX_DT_BF16 && t->dtype != LMX_DT_F16)
        return lmx_fail(err, LMX_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; weights must be F32, F16 or BF16",
                        t->file, t->name, lmx_dtype_name(t->dtype));
    int64_t r = t->ndim >= 2 ? t->shape[0] : 1, c = 1;
    for (int d = t->ndim >= 2 ? 1 : 0; d < t->ndim; d++)
        c *= t->shape[d];
    if (r > INT32_MAX || c > INT32_MAX)
        return lmx_fail(err, LMX_ERR_UNSUPPORTED, "%s: tensor '%s' is too large", t->file, t->name);
    *rows = (int)r;
    *cols = (int)c;
    return LMX_OK;
}

lmx_status lmx_backend_slice(const lmx_st_tensor *t, const lmx_slice *s, lmx_slice *out, lmx_error *err)
{
    int rows, cols;
    if (lmx_backend_weight_view(t, &rows, &cols, err))
        return err ? err->code : LMX_ERR_FORMAT;
    *out = s ? *s : (lmx_slice){0, rows, 0, cols};
    if (out->row0 < 0 || out->rows < 0 || out->row0 > rows - out->rows || out->col0 < 0 || out->cols < 0 ||
        out->col0 > cols - out->cols)
        return lmx_fail(err, LMX_ERR_INTERNAL, "%s: slice [%d +%d, %d +%d] of tensor '%s' outside [%d, %d]",
                        t->file, out->row0, out->rows, out->col0, out->cols, t->name, rows, cols);
    return LMX_OK;
}
