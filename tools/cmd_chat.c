/* lmx chat: an interactive chat that keeps its history and KV cache.
 * /reset clears the history, /system TEXT sets the system prompt, /quit or
 * end of input exits, Ctrl-C stops the current reply. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "genopts.h"
#include "lmx.h"
#include "messages.h"

static lmx_stream *volatile replying;

static void on_sigint(int sig)
{
    (void)sig;
    lmx_stream_cancel(replying);
}

/* Streams the reply to stdout and returns its text (malloc'd), or NULL. */
static char *reply(lmx_stream *s, int verbose)
{
    size_t len = 0, cap = 256;
    char *text = malloc(cap);
    lmx_token t;
    replying = s;
    while (text && lmx_stream_next(s, &t)) {
        fwrite(t.text, 1, t.len, stdout);
        fflush(stdout);
        if (len + t.len + 1 > cap) {
            char *g = realloc(text, cap = (len + t.len + 1) * 2);
            if (!g)
                free(text);
            text = g;
            if (!text)
                break;
        }
        memcpy(text + len, t.text, t.len);
        len += t.len;
    }
    replying = NULL;
    if (text)
        text[len] = 0;
    putchar('\n');
    if (lmx_stream_stop_reason(s) == LMX_STOP_CANCELLED)
        fprintf(stderr, "[stopped]\n");
    if (lmx_stream_error(s))
        fprintf(stderr, "lmx: %s\n", lmx_stream_error(s));
    if (verbose)
        genopts_print_stats(s);
    return text;
}

int cmd_chat(int argc, char **argv)
{
    const char *dir = NULL;
    genopts g = {.load = lmx_load_defaults()};
    for (int i = 1; i < argc; i++) {
        int r = genopts_parse(&g, argc, argv, &i);
        if (r < 0)
            return 2;
        if (r == 0 && (argv[i][0] == '-' || dir)) {
            fprintf(stderr, "usage: lmx chat DIR [options]\n%s", genopts_help);
            return 2;
        }
        if (r == 0)
            dir = argv[i];
    }
    if (!dir) {
        fprintf(stderr, "usage: lmx chat DIR [options]\n%s", genopts_help);
        return 2;
    }
    if (args_tokenizer_present("chat", dir))
        return 1;
    lmx_error err = {0};
    lmx_model *m = lmx_load(dir, &g.load, &err);
    lmx_session *sess = m ? lmx_session_new(m, 0, &err) : NULL;
    if (!sess) {
        fprintf(stderr, "lmx: %s\n", err.message);
        lmx_close(m);
        return 1;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint; /* no SA_RESTART: Ctrl-C at the prompt interrupts the read */
    sigaction(SIGINT, &sa, NULL);
    int tty = isatty(0);
    messages ms = {0};
    char *line = NULL;
    size_t line_cap = 0;
    int rc = 0;
    for (;;) {
        if (tty) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        errno = 0;
        ssize_t n = getline(&line, &line_cap, stdin);
        if (n < 0) {
            if (errno == EINTR) {
                clearerr(stdin);
                putchar('\n');
                continue;
            }
            break; /* end of input */
        }
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = 0;
        if (n == 0)
            continue;
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit"))
            break;
        if (!strcmp(line, "/reset")) {
            int keep = ms.n > 0 && !strcmp(ms.items[0].role, "system");
            messages_truncate(&ms, keep);
            fprintf(stderr, "[history cleared]\n");
            continue;
        }
        if (!strncmp(line, "/system ", 8)) {
            messages_truncate(&ms, 0);
            if (messages_add(&ms, "system", line + 8))
                break;
            fprintf(stderr, "[system prompt set; history cleared]\n");
            continue;
        }
        if (messages_add(&ms, "user", line)) {
            rc = 1;
            break;
        }
        lmx_gen_config cfg = genopts_config(&g, m);
        lmx_stream *s = lmx_session_chat(sess, ms.items, ms.n, &cfg);
        char *text = s ? reply(s, g.verbose) : NULL;
        int failed = !s || lmx_stream_error(s);
        lmx_stream_close(s);
        if (failed || !text || messages_add(&ms, "assistant", text))
            messages_truncate(&ms, ms.n - 1); /* forget the turn that failed */
        free(text);
    }
    free(line);
    messages_free(&ms);
    lmx_session_free(sess);
    lmx_close(m);
    return rc;
}
