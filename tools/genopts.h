/* Options shared by the commands that generate text (run, chat). */
#ifndef LMX_TOOLS_GENOPTS_H
#define LMX_TOOLS_GENOPTS_H

#include "lmx.h"

typedef struct genopts {
    lmx_load_options load;
    /* set flags: which sampling values the user gave (others come from
     * generation_config.json once the model is loaded) */
    int max_tokens, has_max_tokens;
    double temp, top_p, min_p, repeat_penalty;
    long top_k;
    int has_temp, has_top_p, has_min_p, has_repeat_penalty, has_top_k;
    unsigned long long seed;
    int has_seed;
    const char *stops[16];
    int n_stops;
    int ignore_eos, no_thinking, verbose;
} genopts;

/* Tries to parse argv[*i] (and its value) as a shared option. Returns 1 if
 * consumed, 0 if not an option of these, -1 on a bad value (message printed). */
int genopts_parse(genopts *g, int argc, char **argv, int *i);
/* The generation config for the loaded model: its defaults, then the
 * user's values; the seed is random unless given. */
lmx_gen_config genopts_config(const genopts *g, const lmx_model *m);
/* Parses a --device value (cpu, cuda, auto) into an LMX_DEVICE_*; -1 with
 * a message otherwise. */
int genopts_device(const char *v, int *device);
/* Parses a --quant value (none, q8, q4; or 0, 8, 4) into
 * lmx_load_options.quant; -1 with a message otherwise. */
int genopts_quant(const char *v, int *quant);
/* Parses a --kv value (f32, f16) into lmx_load_options.kv_f16; -1 with a
 * message otherwise. */
int genopts_kv(const char *v, int *kv_f16);
/* Help text for the shared options. */
extern const char genopts_help[];
/* Prints the stream's stats to stderr (for --verbose). */
void genopts_print_stats(const lmx_stream *s);

#endif
