/* chat: messages -> prompt text, in a checkpoint's own chat format.
 *
 * Built-in renderers that produce, byte for byte, what the checkpoint's Jinja
 * chat_template produces under transformers' apply_chat_template (see
 * docs/chat.md). The prompt comes back as text plus segments, so that the
 * runtime can encode the caller's text with special-token strings treated as
 * plain text and only the template's own control text as special tokens. */
#ifndef LMX_CHAT_H
#define LMX_CHAT_H

#include <stddef.h>

#include "lmx.h"

typedef enum { LMX_CHAT_QWEN3, LMX_CHAT_GEMMA3 } lmx_chat_format;

/* One run of the prompt text. is_content: caller text (message content), to
 * be encoded with special-token strings as plain text; 0: template text, in
 * which special-token strings are special tokens. */
typedef struct {
    size_t offset, length;
    int is_content;
} lmx_chat_segment;

/* Owned by the caller after lmx_chat_render; free with lmx_chat_prompt_free.
 * text is NUL-terminated (length excludes the NUL). segments cover text in
 * order, contiguously, each of non-zero length; neighbours differ in
 * is_content. */
typedef struct {
    char *text;
    size_t length;
    lmx_chat_segment *segments;
    size_t n_segments;
} lmx_chat_prompt;

typedef struct {
    int add_generation_prompt; /* end with the opening of an assistant turn */
    /* Qwen3: 0 is the template's `enable_thinking=False` (an empty think
     * block after the generation prompt); non-zero is the template default.
     * Ignored by Gemma3. */
    int enable_thinking;
} lmx_chat_options;

/* Renders msgs[0..n) (borrowed). opt NULL means {1, 1}. On success *out owns
 * new memory; on failure *out is zeroed. Errors (LMX_ERR_ARG): n == 0, NULL
 * role or content, a role the format does not know (named, with the message
 * index), a conversation the template itself rejects (Gemma3: roles must
 * alternate user/assistant after an optional leading system message). */
lmx_status lmx_chat_render(lmx_chat_format fmt, const lmx_message *msgs, size_t n,
                           const lmx_chat_options *opt, lmx_chat_prompt *out, lmx_error *err);

void lmx_chat_prompt_free(lmx_chat_prompt *p);

/* Picks the format from a config.json model_type ("qwen3", "gemma3",
 * "gemma3_text"); -1 if none. */
int lmx_chat_format_for(const char *model_type);

#endif
