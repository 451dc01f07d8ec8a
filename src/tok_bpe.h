/* The BPE model of a tokenizer.json: vocabulary, merges, and the merge loop
 * that turns one pre-tokenized word into ids (as tokenizers' BPE::tokenize). */
#ifndef LMX_TOK_BPE_H
#define LMX_TOK_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "lmx.h"
#include "tok_json.h"

/* Ids above this are refused as out of range (the largest real vocabularies
 * have ~262k entries; the per-id tables are sized by the largest id). */
#define LMX_TOK_MAX_ID (1 << 24)

typedef struct lmx_tokbpe lmx_tokbpe;

/* Work space of one encode call (so a loaded model stays read-only). */
typedef struct lmx_tokbpe_scratch {
    void *sym, *heap;
    size_t sym_cap, heap_cap;
    char *tmp;
    size_t tmp_cap;
} lmx_tokbpe_scratch;

/* Parses the "model" object at the cursor. what names the file in errors. */
lmx_status lmx_tokbpe_load(lmx_tokjson *j, const char *what, lmx_tokbpe **out, lmx_error *err);
void lmx_tokbpe_free(lmx_tokbpe *b);

/* Appends the ids of one word to ids. */
lmx_status lmx_tokbpe_encode(const lmx_tokbpe *b, const char *word, size_t len,
                             lmx_tokbpe_scratch *s, lmx_tokids *ids, lmx_error *err);
void lmx_tokbpe_scratch_free(lmx_tokbpe_scratch *s);

int32_t lmx_tokbpe_lookup(const lmx_tokbpe *b, const char *s, size_t len); /* -1 if absent */
/* The token string of id (not NUL-terminated), NULL if id has none. */
const char *lmx_tokbpe_token(const lmx_tokbpe *b, int32_t id, size_t *len);
int32_t lmx_tokbpe_id_limit(const lmx_tokbpe *b); /* largest id + 1 */

#endif
