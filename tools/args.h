/* Argument helpers shared by the lmx subcommands. */
#ifndef LMX_TOOLS_ARGS_H
#define LMX_TOOLS_ARGS_H

#include <stddef.h>
#include <stdint.h>

/* Parses a decimal integer in [lo, hi]; prints an error naming `what` and
 * returns -1 when s is not one. */
int args_int(const char *s, long lo, long hi, const char *what, long *out);
/* Parses a finite number in [lo, hi]; like args_int otherwise. */
int args_float(const char *s, double lo, double hi, const char *what, double *out);
/* Parses "1,2,3" into a malloc'd array (caller frees); -1 with a message
 * on malformed input. */
int args_ids(const char *s, int32_t **ids, size_t *n);
/* Returns argv[*i + 1] and advances *i, or prints "OPT needs a value" and
 * returns NULL. */
const char *args_value(int argc, char **argv, int *i);
/* 0 if model directory dir holds a tokenizer.json, which text generation
 * needs; else prints so, naming cmd, and returns -1 (before the weights
 * load, not after). A dir that does not exist is left to lmx_load. */
int args_tokenizer_present(const char *cmd, const char *dir);

#endif
