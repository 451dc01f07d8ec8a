/* libFuzzer target: chat messages through lmx_chat_render, both formats.
 * Input: one byte of settings (bit 0: Gemma3 rather than Qwen3; bit 1:
 * generation prompt; bit 2: thinking), then role, content, role, ...
 * separated by NUL bytes. A role of one byte from 1 to 8 stands for a
 * known role (so that valid conversations are easy to reach); any other
 * is taken as written. A rendered prompt must satisfy lmx_chat_prompt's
 * contract: NUL-terminated text covered in order by non-empty segments
 * whose neighbours differ in is_content. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"

enum { MAX_MESSAGES = 64 };

static const char *const KNOWN_ROLES[8] = {"system", "user", "assistant", "tool",
                                           "model", "", "developer", "function"};

static void check_prompt(const lmx_chat_prompt *p)
{
    if (!p->text || p->text[p->length] != '\0' || p->n_segments == 0)
        abort();
    size_t at = 0;
    for (size_t i = 0; i < p->n_segments; i++) {
        const lmx_chat_segment *s = &p->segments[i];
        if (s->offset != at || s->length == 0 ||
            (i > 0 && s->is_content == p->segments[i - 1].is_content))
            abort();
        at += s->length;
    }
    if (at != p->length)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    uint8_t settings = data[0];
    /* a private, NUL-terminated copy: its NUL bytes end the fields */
    char *text = malloc(size);
    if (!text)
        return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    const char *end = text + size - 1;
    lmx_message msgs[MAX_MESSAGES];
    size_t n = 0;
    for (const char *p = text; p < end && n < MAX_MESSAGES;) {
        const char *role = p;
        p += strlen(p) + 1;
        if (p > end)
            break;
        const char *content = p;
        p += strlen(p) + 1;
        if (role[0] && !role[1] && (uint8_t)role[0] <= 8)
            role = KNOWN_ROLES[(uint8_t)role[0] - 1];
        msgs[n++] = (lmx_message){role, content};
    }
    lmx_chat_options opt = {(settings >> 1) & 1, (settings >> 2) & 1};
    lmx_chat_prompt out;
    memset(&out, 0xa5, sizeof out); /* so that "left zeroed" is checked, not assumed */
    lmx_error err;
    lmx_chat_format fmt = settings & 1 ? LMX_CHAT_GEMMA3 : LMX_CHAT_QWEN3;
    if (lmx_chat_render(fmt, msgs, n, &opt, &out, &err) == LMX_OK) {
        check_prompt(&out);
        lmx_chat_prompt_free(&out);
    } else if (out.text || out.segments) {
        abort(); /* a failed render leaves *out zeroed */
    }
    free(text);
    return 0;
}
