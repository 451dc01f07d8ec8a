/* The tokenizer: a Hugging Face tokenizer.json (BPE model; Qwen3 byte-level
 * and Gemma3 SentencePiece-style with byte fallback) -> encode, decode and
 * streaming decode, token for token as the tokenizers library.
 *
 * A loaded tokenizer is read-only: encode/decode may run on many threads at
 * once (each call keeps its own work space). See docs/tokenizer.md for what
 * is supported and for the behaviour on invalid UTF-8 and special tokens. */
#ifndef LMX_TOKENIZER_H
#define LMX_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "lmx.h"
#include "tok_util.h"

typedef struct lmx_tokenizer lmx_tokenizer;

/* Loads dir/tokenizer.json, and dir/tokenizer_config.json when present
 * (bos/eos tokens, chat template). *out is freed with lmx_tokenizer_free. */
lmx_status lmx_tokenizer_load(const char *dir, lmx_tokenizer **out, lmx_error *err);
/* Loads tokenizer.json text (len bytes, need not be NUL-terminated); what
 * names it in error messages. */
lmx_status lmx_tokenizer_load_json(const char *json, size_t len, const char *what,
                                   lmx_tokenizer **out, lmx_error *err);
void lmx_tokenizer_free(lmx_tokenizer *t);

enum {
    LMX_TOK_ADD_SPECIAL = 1,  /* add the post-processor's tokens (Gemma's <bos>) */
    LMX_TOK_PLAIN_SPECIAL = 2 /* special-token strings in the text are plain text */
};

/* Encodes text (len bytes; invalid UTF-8 is read as if each ill-formed
 * sequence were U+FFFD). *ids is malloc'd (caller frees), *n its length. */
lmx_status lmx_tokenizer_encode(const lmx_tokenizer *t, const char *text, size_t len, int flags,
                                int32_t **ids, size_t *n, lmx_error *err);
/* Decodes ids; *text is malloc'd and NUL-terminated (caller frees). An id
 * that names no token fails with LMX_ERR_RANGE. */
lmx_status lmx_tokenizer_decode(const lmx_tokenizer *t, const int32_t *ids, size_t n,
                                int skip_special, char **text, size_t *len, lmx_error *err);

int32_t lmx_tokenizer_token_id(const lmx_tokenizer *t, const char *token); /* -1 if absent */
int lmx_tokenizer_is_special(const lmx_tokenizer *t, int32_t id);
int lmx_tokenizer_vocab_size(const lmx_tokenizer *t); /* largest id + 1, added tokens included */
int32_t lmx_tokenizer_bos_id(const lmx_tokenizer *t); /* from tokenizer_config.json, -1 if none */
int32_t lmx_tokenizer_eos_id(const lmx_tokenizer *t);
const char *lmx_tokenizer_chat_template(const lmx_tokenizer *t); /* NULL if none */

/* For the streaming decoder: decode into a buffer (replacing its content). */
lmx_status lmx_tokenizer_decode_buf(const lmx_tokenizer *t, const int32_t *ids, size_t n,
                                    lmx_tokbuf *out, lmx_error *err);
/* 1 if id decodes through a byte-fallback run (streaming holds those back). */
int lmx_tokenizer_is_byte_piece(const lmx_tokenizer *t, int32_t id);

#include "tokenizer_stream.h"

#endif
