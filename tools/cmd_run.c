/* lmx run: generate text from a prompt (or a one-message chat), streaming
 * to stdout, or as one JSON object with --json. */
#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "genopts.h"
#include "lmx.h"

static lmx_stream *volatile current; /* for Ctrl-C */

static void on_sigint(int sig)
{
    (void)sig;
    lmx_stream_cancel(current);
}

static int usage(void)
{
    fprintf(stderr, "usage: lmx run DIR [-p TEXT | --prompt-ids 1,2,3] [--chat] [--system TEXT] [--json] [options]\n"
                    "  (without -p or --prompt-ids the prompt is read from stdin)\n%s", genopts_help);
    return 2;
}

static char *read_stdin(void)
{
    size_t cap = 4096, len = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + len, 1, cap - len - 1, stdin)) > 0) {
        len += got;
        if (cap - len < 2) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb)
                free(buf);
            buf = nb;
        }
    }
    if (buf)
        buf[len] = 0;
    return buf;
}

static void print_json(lmx_stream *s, const int32_t *ids, int n, const char *text)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(o, "ids");
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    cJSON_AddStringToObject(o, "text", text);
    cJSON_AddStringToObject(o, "stop_reason", lmx_stop_reason_name(lmx_stream_stop_reason(s)));
    if (lmx_stream_error(s))
        cJSON_AddStringToObject(o, "error", lmx_stream_error(s));
    lmx_stats st;
    lmx_stream_stats(s, &st);
    cJSON *js = cJSON_AddObjectToObject(o, "stats");
    cJSON_AddNumberToObject(js, "prompt_tokens", st.prompt_tokens);
    cJSON_AddNumberToObject(js, "generated_tokens", st.generated_tokens);
    cJSON_AddNumberToObject(js, "ttft_s", st.ttft_s);
    cJSON_AddNumberToObject(js, "prefill_tok_s", st.prefill_tok_s);
    cJSON_AddNumberToObject(js, "decode_tok_s", st.decode_tok_s);
    cJSON_AddNumberToObject(js, "peak_rss_mb", st.peak_rss_mb);
    char *out = cJSON_PrintUnformatted(o);
    if (out)
        puts(out);
    free(out);
    cJSON_Delete(o);
}

/* Streams to stdout, or collects for --json; returns the exit status. */
static int consume(lmx_stream *s, int json, int verbose)
{
    int32_t *ids = NULL;
    char *text = NULL;
    size_t n = 0, cap = 0, len = 0, tcap = 1;
    text = calloc(1, 1);
    lmx_token t;
    current = s;
    while (text && lmx_stream_next(s, &t)) {
        if (!json) {
            fwrite(t.text, 1, t.len, stdout);
            fflush(stdout);
            continue;
        }
        if (t.id >= 0) {
            if (n == cap) {
                int32_t *g = realloc(ids, (cap = cap ? cap * 2 : 64) * sizeof *g);
                if (!g)
                    break;
                ids = g;
            }
            ids[n++] = t.id;
        }
        if (len + t.len + 1 > tcap) {
            char *g = realloc(text, tcap = (len + t.len + 1) * 2);
            if (!g)
                break;
            text = g;
        }
        memcpy(text + len, t.text, t.len);
        text[len += t.len] = 0;
    }
    current = NULL;
    if (json && text)
        print_json(s, ids, (int)n, text);
    else if (!json)
        putchar('\n');
    if (verbose)
        genopts_print_stats(s);
    int rc = 0;
    if (lmx_stream_error(s)) {
        fprintf(stderr, "lmx: %s\n", lmx_stream_error(s));
        rc = 1;
    }
    free(ids);
    free(text);
    return rc;
}

int cmd_run(int argc, char **argv)
{
    const char *dir = NULL, *prompt = NULL, *ids_arg = NULL, *system = NULL;
    int chat = 0, json = 0;
    genopts g = {.load = lmx_load_defaults()};
    for (int i = 1; i < argc; i++) {
        int r = genopts_parse(&g, argc, argv, &i);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (!strcmp(argv[i], "-p") || !strcmp(argv[i], "--prompt")) {
            if (!(prompt = args_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(argv[i], "--prompt-ids")) {
            if (!(ids_arg = args_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(argv[i], "--system")) {
            if (!(system = args_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(argv[i], "--chat")) {
            chat = 1;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "lmx run: unexpected argument '%s'\n", argv[i]);
            return usage();
        } else {
            dir = argv[i];
        }
    }
    if (!dir || (prompt && ids_arg) || (ids_arg && (chat || system)))
        return usage();
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (ids_arg && args_ids(ids_arg, &ids, &n_ids))
        return 2;
    char *input = NULL;
    if (!prompt && !ids_arg && !(prompt = input = read_stdin())) {
        fprintf(stderr, "lmx: cannot read the prompt from stdin\n");
        return 1;
    }
    if (args_tokenizer_present("run", dir)) {
        free(ids);
        free(input);
        return 1;
    }
    lmx_error err = {0};
    lmx_model *m = lmx_load(dir, &g.load, &err);
    int rc = 1;
    if (!m) {
        fprintf(stderr, "lmx: %s\n", err.message);
    } else {
        lmx_gen_config cfg = genopts_config(&g, m);
        lmx_stream *s;
        if (ids) {
            s = lmx_generate_ids(m, ids, (int)n_ids, &cfg);
        } else if (chat || system) {
            lmx_message msgs[2] = {{"system", system}, {"user", prompt}};
            s = system ? lmx_chat(m, msgs, 2, &cfg) : lmx_chat(m, msgs + 1, 1, &cfg);
        } else {
            s = lmx_generate(m, prompt, &cfg);
        }
        if (s) {
            signal(SIGINT, on_sigint);
            rc = consume(s, json, g.verbose);
            signal(SIGINT, SIG_DFL);
        } else {
            fprintf(stderr, "lmx: out of memory\n");
        }
        lmx_stream_close(s);
        lmx_close(m);
    }
    free(ids);
    free(input);
    return rc;
}
