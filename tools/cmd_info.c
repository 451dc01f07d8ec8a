#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "genopts.h"
#include "lmx.h"

int cmd_info(int argc, char **argv)
{
    const char *dir = NULL;
    lmx_load_options opts = lmx_load_defaults();
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--device")) {
            if (!(v = args_value(argc, argv, &i)) || genopts_device(v, &opts.device))
                return 2;
        } else if (!strcmp(argv[i], "--gpus")) {
            long n;
            if (!(v = args_value(argc, argv, &i)) || args_int(v, 1, 8, "--gpus", &n))
                return 2;
            opts.n_gpus = (int)n;
        } else if (argv[i][0] == '-' || dir) {
            dir = NULL;
            break;
        } else {
            dir = argv[i];
        }
    }
    if (!dir) {
        fprintf(stderr, "usage: lmx info DIR [--device cpu|cuda] [--gpus N]\n");
        return 2;
    }
    lmx_error err = {0};
    lmx_model *m = lmx_load(dir, &opts, &err);
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
