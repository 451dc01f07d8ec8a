#include <stdio.h>

#include "commands.h"

int cmd_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("lmx 0.1.0\n");
    return 0;
}
