/* Built-in chat renderers. Each function mirrors its checkpoint's Jinja
 * chat_template branch by branch (the templates live in each checkpoint's
 * tokenizer_config.json); comments quote the template where the C is not
 * obvious. Python string methods used by the templates (split, strip,
 * lstrip, startswith, `in`) are reproduced on UTF-8 bytes, which is exact
 * because every needle and strip set involved is ASCII, except Jinja's
 * `trim`, which strips Unicode whitespace and is decoded for that. */
#include "chat.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

/* ---- output builder ------------------------------------------------------ */

typedef struct {
    char *text;
    size_t len, cap;
    lmx_chat_segment *seg;
    size_t nseg, segcap;
    int nomem;
} builder;

static void emit(builder *b, const char *s, size_t n, int is_content) {
    if (n == 0 || b->nomem)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *t = realloc(b->text, cap);
        if (!t) {
            b->nomem = 1;
            return;
        }
        b->text = t;
        b->cap = cap;
    }
    memcpy(b->text + b->len, s, n);
    if (b->nseg > 0 && b->seg[b->nseg - 1].is_content == is_content) {
        b->seg[b->nseg - 1].length += n;
    } else {
        if (b->nseg == b->segcap) {
            size_t cap = b->segcap ? b->segcap * 2 : 16;
            lmx_chat_segment *t = realloc(b->seg, cap * sizeof *t);
            if (!t) {
                b->nomem = 1;
                return;
            }
            b->seg = t;
            b->segcap = cap;
        }
        b->seg[b->nseg++] = (lmx_chat_segment){b->len, n, is_content};
    }
    b->len += n;
    b->text[b->len] = '\0';
}

static void ctl(builder *b, const char *s) { emit(b, s, strlen(s), 0); }

/* ---- Python-style string slices ------------------------------------------ */

typedef struct {
    const char *p;
    size_t n;
} slice;

static slice mkslice(const char *s) { return (slice){s, strlen(s)}; }

static void put(builder *b, slice s) { emit(b, s.p, s.n, 1); }

/* Offset of the first (last != 0: last) occurrence of needle, or -1. */
static long find(slice s, const char *needle, int last) {
    size_t m = strlen(needle);
    if (m > s.n)
        return -1;
    long found = -1;
    for (size_t i = 0; i + m <= s.n; i++) {
        if (memcmp(s.p + i, needle, m) == 0) {
            found = (long)i;
            if (!last)
                break;
        }
    }
    return found;
}

static int starts_with(slice s, const char *pre) {
    size_t m = strlen(pre);
    return s.n >= m && memcmp(s.p, pre, m) == 0;
}

static int ends_with(slice s, const char *suf) {
    size_t m = strlen(suf);
    return s.n >= m && memcmp(s.p + s.n - m, suf, m) == 0;
}

/* s.lstrip('\n') / s.rstrip('\n') */
static slice lstrip_nl(slice s) {
    while (s.n > 0 && s.p[0] == '\n')
        s.p++, s.n--;
    return s;
}

static slice rstrip_nl(slice s) {
    while (s.n > 0 && s.p[s.n - 1] == '\n')
        s.n--;
    return s;
}

/* s.split(sep)[-1] */
static slice after_last(slice s, const char *sep) {
    long at = find(s, sep, 1);
    if (at < 0)
        return s;
    size_t skip = (size_t)at + strlen(sep);
    return (slice){s.p + skip, s.n - skip};
}

/* s.split(sep)[0] */
static slice before_first(slice s, const char *sep) {
    long at = find(s, sep, 0);
    return at < 0 ? s : (slice){s.p, (size_t)at};
}

/* Python's str.isspace() for one code point (what Jinja's `trim` strips). */
static int py_space(unsigned cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 ||
           cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Decodes the well-formed UTF-8 character at s[0..n); returns its length, or
 * 0 when the bytes there are not one (such bytes are never whitespace). */
static size_t utf8_decode(const unsigned char *s, size_t n, unsigned *cp) {
    if (n == 0)
        return 0;
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    size_t len = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC0 ? 2 : 0;
    if (len == 0 || len > n)
        return 0;
    unsigned c = s[0] & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        c = (c << 6) | (s[i] & 0x3F);
    }
    static const unsigned min_for_len[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < min_for_len[len] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
        return 0;
    *cp = c;
    return len;
}

/* Jinja's `| trim`: Python's str.strip() with no argument. */
static slice trim(slice s) {
    unsigned cp;
    size_t k;
    while ((k = utf8_decode((const unsigned char *)s.p, s.n, &cp)) > 0 && py_space(cp))
        s.p += k, s.n -= k;
    while (s.n > 0) {
        size_t start = s.n - 1; /* back up to the last character's lead byte */
        while (start > 0 && s.n - start < 4 && ((unsigned char)s.p[start] & 0xC0) == 0x80)
            start--;
        k = utf8_decode((const unsigned char *)s.p + start, s.n - start, &cp);
        if (k != s.n - start || !py_space(cp))
            break;
        s.n = start;
    }
    return s;
}

/* ---- Qwen3 ------------------------------------------------------------------ */

static int is_role(const lmx_message *m, const char *role) { return strcmp(m->role, role) == 0; }

static void qwen3_assistant(builder *b, const lmx_message *msgs, size_t n, size_t i,
                            size_t last_query) {
    slice content = mkslice(msgs[i].content), reasoning = {"", 0};
    /* {%- if '</think>' in message.content %}: split off the reasoning. */
    if (find(content, "</think>", 0) >= 0) {
        slice whole = content;
        content = lstrip_nl(after_last(whole, "</think>"));
        reasoning = lstrip_nl(after_last(rstrip_nl(before_first(whole, "</think>")), "<think>"));
    }
    /* Reasoning is shown only after the last real user query, and there only
     * for the final message or where it is non-empty. */
    if (i > last_query && (i == n - 1 || reasoning.n > 0)) {
        ctl(b, "<|im_start|>assistant\n<think>\n");
        put(b, rstrip_nl(lstrip_nl(reasoning)));
        ctl(b, "\n</think>\n\n");
        put(b, lstrip_nl(content));
    } else {
        ctl(b, "<|im_start|>assistant\n");
        put(b, content);
    }
    ctl(b, "<|im_end|>\n");
}

static void render_qwen3(builder *b, const lmx_message *msgs, size_t n,
                         const lmx_chat_options *opt) {
    if (is_role(&msgs[0], "system")) {
        ctl(b, "<|im_start|>system\n");
        put(b, mkslice(msgs[0].content));
        ctl(b, "<|im_end|>\n");
    }
    /* ns.last_query_index: the last user message that is not a wrapped tool
     * response; n - 1 when there is none. */
    size_t last_query = n - 1;
    for (size_t j = n; j-- > 0;) {
        slice c = mkslice(msgs[j].content);
        if (is_role(&msgs[j], "user") &&
            !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
            last_query = j;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const lmx_message *m = &msgs[i];
        if (is_role(m, "user") || (is_role(m, "system") && i > 0)) {
            ctl(b, "<|im_start|>");
            ctl(b, m->role);
            ctl(b, "\n");
            put(b, mkslice(m->content));
            ctl(b, "<|im_end|>\n");
        } else if (is_role(m, "assistant")) {
            qwen3_assistant(b, msgs, n, i, last_query);
        } else if (is_role(m, "tool")) {
            /* Consecutive tool results share one user turn. */
            if (i == 0 || !is_role(&msgs[i - 1], "tool"))
                ctl(b, "<|im_start|>user");
            ctl(b, "\n<tool_response>\n");
            put(b, mkslice(m->content));
            ctl(b, "\n</tool_response>");
            if (i == n - 1 || !is_role(&msgs[i + 1], "tool"))
                ctl(b, "<|im_end|>\n");
        }
    }
    if (opt->add_generation_prompt) {
        ctl(b, "<|im_start|>assistant\n");
        if (!opt->enable_thinking)
            ctl(b, "<think>\n\n</think>\n\n");
    }
}

/* ---- Gemma3 ----------------------------------------------------------------- */

static lmx_status render_gemma3(builder *b, const lmx_message *msgs, size_t n,
                                const lmx_chat_options *opt, lmx_error *err) {
    /* A leading system message is folded, untrimmed, into the first turn. */
    size_t first = is_role(&msgs[0], "system") ? 1 : 0;
    for (size_t i = first; i < n; i++) {
        if (is_role(&msgs[i], "user") != ((i - first) % 2 == 0))
            return lmx_fail(err, LMX_ERR_ARG,
                            "chat message %zu: role \"%s\": Gemma3 conversation roles must "
                            "alternate user/assistant/user/assistant/... (after an optional "
                            "leading system message)",
                            i, msgs[i].role);
    }
    ctl(b, "<bos>"); /* {{ bos_token }}: the template writes BOS as text */
    for (size_t i = first; i < n; i++) {
        ctl(b, "<start_of_turn>");
        ctl(b, is_role(&msgs[i], "assistant") ? "model" : msgs[i].role);
        ctl(b, "\n");
        if (i == first && first == 1) {
            put(b, mkslice(msgs[0].content));
            ctl(b, "\n\n");
        }
        put(b, trim(mkslice(msgs[i].content)));
        ctl(b, "<end_of_turn>\n");
    }
    if (opt->add_generation_prompt)
        ctl(b, "<start_of_turn>model\n");
    return LMX_OK;
}

/* ---- entry points ------------------------------------------------------------ */

lmx_status lmx_chat_render(lmx_chat_format fmt, const lmx_message *msgs, size_t n,
                           const lmx_chat_options *opt, lmx_chat_prompt *out, lmx_error *err) {
    static const char *const qwen3_roles[] = {"system", "user", "assistant", "tool", NULL};
    static const char *const gemma3_roles[] = {"system", "user", "assistant", NULL};
    static const lmx_chat_options defaults = {1, 1};

    if (!out)
        return lmx_fail(err, LMX_ERR_ARG, "chat: out is NULL");
    memset(out, 0, sizeof *out);
    if (fmt != LMX_CHAT_QWEN3 && fmt != LMX_CHAT_GEMMA3)
        return lmx_fail(err, LMX_ERR_ARG, "chat: unknown format %d", (int)fmt);
    if (n == 0 || !msgs)
        return lmx_fail(err, LMX_ERR_ARG, "chat: no messages");
    const char *const *roles = fmt == LMX_CHAT_QWEN3 ? qwen3_roles : gemma3_roles;
    const char *family = fmt == LMX_CHAT_QWEN3 ? "Qwen3" : "Gemma3";
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role)
            return lmx_fail(err, LMX_ERR_ARG, "chat message %zu: role is NULL", i);
        if (!msgs[i].content)
            return lmx_fail(err, LMX_ERR_ARG, "chat message %zu (%.64s): content is NULL", i,
                            msgs[i].role);
        size_t r = 0;
        while (roles[r] && strcmp(roles[r], msgs[i].role) != 0)
            r++;
        if (!roles[r])
            return lmx_fail(err, LMX_ERR_ARG,
                            "chat message %zu: unknown role \"%.64s\" (%s chat accepts %s)", i,
                            msgs[i].role, family,
                            fmt == LMX_CHAT_QWEN3 ? "system, user, assistant, tool"
                                                  : "system, user, assistant");
    }
    if (!opt)
        opt = &defaults;

    builder b = {0};
    lmx_status st = LMX_OK;
    if (fmt == LMX_CHAT_QWEN3)
        render_qwen3(&b, msgs, n, opt);
    else
        st = render_gemma3(&b, msgs, n, opt, err);
    if (st == LMX_OK && b.nomem)
        st = lmx_fail(err, LMX_ERR_NOMEM, "chat: out of memory rendering %zu messages", n);
    if (st != LMX_OK) {
        free(b.text);
        free(b.seg);
        return st;
    }
    out->text = b.text;
    out->length = b.len;
    out->segments = b.seg;
    out->n_segments = b.nseg;
    return LMX_OK;
}

void lmx_chat_prompt_free(lmx_chat_prompt *p) {
    if (!p)
        return;
    free(p->text);
    free(p->segments);
    memset(p, 0, sizeof *p);
}

int lmx_chat_format_for(const char *model_type) {
    if (!model_type)
        return -1;
    if (strcmp(model_type, "qwen3") == 0)
        return LMX_CHAT_QWEN3;
    if (strcmp(model_type, "gemma3") == 0 || strcmp(model_type, "gemma3_text") == 0)
        return LMX_CHAT_GEMMA3;
    return -1;
}
