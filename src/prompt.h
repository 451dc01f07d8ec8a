/* Prompts to token ids: plain text, and chats rendered in the checkpoint's
 * own format with the caller's text kept from becoming control tokens. */
#ifndef LMX_PROMPT_H
#define LMX_PROMPT_H

#include "lmx.h"

/* Encodes text with the model's tokenizer; *ids malloc'd (caller frees). */
lmx_status lmx_prompt_text(const lmx_model *m, const char *text, int add_special, int32_t **ids,
                           int *n, lmx_error *err);

/* Renders msgs and encodes them: the template's special-token text becomes
 * control tokens; special-token text inside message content stays plain
 * text. *ids malloc'd (caller frees). */
lmx_status lmx_prompt_chat(const lmx_model *m, const lmx_message *msgs, int n, int add_generation_prompt,
                           int enable_thinking, int32_t **ids, int *n_ids, lmx_error *err);

#endif
