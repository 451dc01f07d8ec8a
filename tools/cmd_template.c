/* lmx template: prints a chat rendered in the checkpoint's format, exactly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "lmx.h"
#include "messages.h"

int cmd_template(int argc, char **argv)
{
    const char *dir = NULL, *file = NULL;
    int gen_prompt = 1, thinking = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--messages")) {
            if (!(file = args_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(argv[i], "--no-generation-prompt")) {
            gen_prompt = 0;
        } else if (!strcmp(argv[i], "--no-thinking")) {
            thinking = 0;
        } else if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "lmx template: unexpected argument '%s'\n", argv[i]);
            dir = NULL;
            break;
        } else {
            dir = argv[i];
        }
    }
    if (!dir || !file) {
        fprintf(stderr, "usage: lmx template DIR --messages FILE.json [--no-generation-prompt] [--no-thinking]\n");
        return 2;
    }
    messages ms = {0};
    if (messages_load_json(&ms, file)) {
        messages_free(&ms);
        return 1;
    }
    lmx_error err = {0};
    lmx_model *m = lmx_load(dir, NULL, &err);
    char *text = NULL;
    int rc = 1;
    if (m && lmx_chat_template(m, ms.items, ms.n, gen_prompt, thinking, &text, &err) == LMX_OK) {
        fputs(text, stdout);
        rc = 0;
    } else {
        fprintf(stderr, "lmx: %s\n", err.message);
    }
    free(text);
    lmx_close(m);
    messages_free(&ms);
    return rc;
}
