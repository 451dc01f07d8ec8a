/* Post-processors of tokenizer.json, for single sequences when special
 * tokens are added: TemplateProcessing, BertProcessing, RobertaProcessing,
 * ByteLevel (adds nothing) and Sequence. */
#ifndef LMX_TOK_POST_H
#define LMX_TOK_POST_H

#include <cjson/cJSON.h>

#include "lmx.h"
#include "tok_util.h"

typedef struct lmx_tokpost lmx_tokpost;

/* j: the "post_processor" value; JSON null gives *out = NULL. */
lmx_status lmx_tokpost_build(const cJSON *j, const char *what, lmx_tokpost **out, lmx_error *err);
void lmx_tokpost_free(lmx_tokpost *p);
/* Rewrites ids with the special tokens around them. p may be NULL. */
lmx_status lmx_tokpost_apply(const lmx_tokpost *p, lmx_tokids *ids, lmx_error *err);
/* The largest id the post-processor adds, -1 if none (p may be NULL). */
int32_t lmx_tokpost_max_id(const lmx_tokpost *p);

#endif
