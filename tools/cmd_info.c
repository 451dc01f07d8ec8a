#include <stdio.h>
#include <stdlib.h>

#include "commands.h"
#include "lmx.h"

int cmd_info(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: lmx info DIR\n");
        return 2;
    }
    lmx_error err = {0};
    lmx_model *m = lmx_load(argv[1], NULL, &err);
    if (!m) {
        fprintf(stderr, "lmx: %s\n", err.message);
        return 1;
    }
    char *text = lmx_model_describe(m);
    if (text)
        fputs(text, stdout);
    free(text);
    lmx_close(m);
    return text ? 0 : 1;
}
