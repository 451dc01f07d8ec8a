/* Stop strings across token boundaries. */
#include <string.h>

#include "stopstr.h"
#include "testutil.h"

/* Feeds pieces; returns the concatenated released text and whether a stop matched. */
static int feed(const char *const *stops, int n, const char *const *pieces, int np, char *out, int *released_at)
{
    lmx_stopstr s;
    lmx_stopstr_init(&s, stops, n);
    out[0] = 0;
    int hit = 0;
    for (int i = 0; i < np && !hit; i++) {
        const char *e;
        size_t el;
        hit = lmx_stopstr_push(&s, pieces[i], strlen(pieces[i]), &e, &el);
        strncat(out, e, el);
        released_at[i] = (int)strlen(out);
    }
    if (!hit) {
        const char *e;
        size_t el;
        lmx_stopstr_flush(&s, &e, &el);
        strncat(out, e, el);
    }
    lmx_stopstr_free(&s);
    return hit;
}

int main(void)
{
    char out[256];
    int at[16];
    const char *stops[] = {"</answer>", "STOP"};
    const char *p1[] = {"The result", " is 4</", "ans", "wer> and more"};
    CHECK(feed(stops, 2, p1, 4, out, at) == 1, "match across three tokens");
    CHECK(!strcmp(out, "The result is 4"), "released '%s'", out);
    CHECK(at[1] == (int)strlen("The result is 4"), "'</' held back after token 2 (released %d)", at[1]);

    const char *p2[] = {"a</", "b>", " ST", "OP", "x"};
    CHECK(feed(stops, 2, p2, 5, out, at) == 1, "second stop string");
    CHECK(!strcmp(out, "a</b> "), "released '%s'", out);
    CHECK(at[1] == 5, "false start released once disproved: %d", at[1]);

    const char *p3[] = {"no stop here </ans"};
    CHECK(feed(stops, 2, p3, 1, out, at) == 0, "no match");
    CHECK(at[0] == (int)strlen("no stop here "), "partial held: %d", at[0]);
    CHECK(!strcmp(out, "no stop here </ans"), "flush releases held text: '%s'", out);

    const char *p4[] = {"xSTOPySTOP"};
    CHECK(feed(stops, 2, p4, 1, out, at) == 1 && !strcmp(out, "x"), "earliest match: '%s'", out);

    const char *p5[] = {"héllo ", "wörld"};
    CHECK(feed(NULL, 0, p5, 2, out, at) == 0 && !strcmp(out, "héllo wörld"), "no stops: '%s'", out);
    return test_finish();
}
