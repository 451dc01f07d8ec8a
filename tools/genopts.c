#include "genopts.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "args.h"

const char genopts_help[] =
    "  -n N                  generate at most N tokens (default: until EOS or a full context)\n"
    "  --temp F              temperature (0 = greedy); default from generation_config.json\n"
    "  --top-k K             keep the K most likely tokens (0 = off)\n"
    "  --top-p F             nucleus sampling: smallest set reaching probability F (1 = off)\n"
    "  --min-p F             drop tokens below F x the top probability (0 = off)\n"
    "  --repeat-penalty F    transformers' repetition penalty (1 = off)\n"
    "  --seed S              random seed (default: random)\n"
    "  --stop STR            stop before STR (repeatable, up to 16)\n"
    "  --ignore-eos          do not stop at end-of-sequence tokens\n"
    "  --no-thinking         Qwen3 chat: the empty think block (enable_thinking=false)\n"
    "  --threads T           CPU threads (default: all cores)\n"
    "  --device D            cpu or cuda (default: cuda when built with it and a GPU is present)\n"
    "  --gpus N              tensor parallelism over N GPUs (cpu: N ranks on the CPU)\n"
    "  --quant Q             quantize the weights while loading: q8 or q4 (default: none, as stored)\n"
    "  --kv T                CPU KV cache: f32 (default) or f16 (half the memory and the bytes decode reads)\n"
    "  --mmap                CPU: read weights in place from the file (quicker load, slower decode)\n"
    "  --prefill-bf16        CPU: prompts' products with bf16 weights on x rounded to bf16 (AVX-512 BF16:\n"
    "                        faster prefill, logits ~1e-2 off)\n"
    "  --ctx N               context length (default: the model's, at most 4096)\n"
    "  --verbose             print stats to stderr\n";

int genopts_parse(genopts *g, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    long n;
    double f;
#define VALUE() (v = args_value(argc, argv, i))
    if (!strcmp(a, "-n")) {
        if (!VALUE() || args_int(v, 0, 1 << 30, "-n", &n))
            return -1;
        g->max_tokens = (int)n;
        g->has_max_tokens = 1;
    } else if (!strcmp(a, "--temp")) {
        if (!VALUE() || args_float(v, 0, 1e4, "--temp", &f))
            return -1;
        g->temp = f;
        g->has_temp = 1;
    } else if (!strcmp(a, "--top-k")) {
        if (!VALUE() || args_int(v, 0, 1 << 30, "--top-k", &g->top_k))
            return -1;
        g->has_top_k = 1;
    } else if (!strcmp(a, "--top-p")) {
        if (!VALUE() || args_float(v, 1e-9, 1, "--top-p", &f))
            return -1;
        g->top_p = f;
        g->has_top_p = 1;
    } else if (!strcmp(a, "--min-p")) {
        if (!VALUE() || args_float(v, 0, 1, "--min-p", &f))
            return -1;
        g->min_p = f;
        g->has_min_p = 1;
    } else if (!strcmp(a, "--repeat-penalty")) {
        if (!VALUE() || args_float(v, 1e-6, 1e6, "--repeat-penalty", &f))
            return -1;
        g->repeat_penalty = f;
        g->has_repeat_penalty = 1;
    } else if (!strcmp(a, "--seed")) {
        if (!VALUE() || args_int(v, 0, 0x7fffffffffffffffL, "--seed", &n))
            return -1;
        g->seed = (unsigned long long)n;
        g->has_seed = 1;
    } else if (!strcmp(a, "--stop")) {
        if (!VALUE())
            return -1;
        if (!v[0] || g->n_stops == 16) {
            fprintf(stderr, "lmx: --stop needs a non-empty string (at most 16 of them)\n");
            return -1;
        }
        g->stops[g->n_stops++] = v;
    } else if (!strcmp(a, "--threads")) {
        if (!VALUE() || args_int(v, 0, 1024, "--threads", &n))
            return -1;
        g->load.n_threads = (int)n;
    } else if (!strcmp(a, "--device")) {
        if (!VALUE() || genopts_device(v, &g->load.device))
            return -1;
    } else if (!strcmp(a, "--gpus")) {
        if (!VALUE() || args_int(v, 1, 8, "--gpus", &n))
            return -1;
        g->load.n_gpus = (int)n;
    } else if (!strcmp(a, "--quant")) {
        if (!VALUE() || genopts_quant(v, &g->load.quant))
            return -1;
    } else if (!strcmp(a, "--kv")) {
        if (!VALUE() || genopts_kv(v, &g->load.kv_f16))
            return -1;
    } else if (!strcmp(a, "--mmap")) {
        g->load.mmap_weights = 1;
    } else if (!strcmp(a, "--prefill-bf16")) {
        g->load.prefill_bf16 = 1;
    } else if (!strcmp(a, "--ctx")) {
        if (!VALUE() || args_int(v, 1, 1 << 24, "--ctx", &n))
            return -1;
        g->load.n_ctx = (int)n;
    } else if (!strcmp(a, "--ignore-eos")) {
        g->ignore_eos = 1;
    } else if (!strcmp(a, "--no-thinking")) {
        g->no_thinking = 1;
    } else if (!strcmp(a, "--verbose")) {
        g->verbose = 1;
    } else {
        return 0;
    }
#undef VALUE
    return 1;
}

int genopts_device(const char *v, int *device)
{
    if (!strcmp(v, "cpu"))
        *device = LMX_DEVICE_CPU;
    else if (!strcmp(v, "cuda"))
        *device = LMX_DEVICE_CUDA;
    else if (!strcmp(v, "auto"))
        *device = LMX_DEVICE_AUTO;
    else {
        fprintf(stderr, "lmx: --device '%s': want cpu, cuda or auto\n", v);
        return -1;
    }
    return 0;
}

int genopts_quant(const char *v, int *quant)
{
    if (!strcmp(v, "none") || !strcmp(v, "0"))
        *quant = 0;
    else if (!strcmp(v, "q8") || !strcmp(v, "8"))
        *quant = 8;
    else if (!strcmp(v, "q4") || !strcmp(v, "4"))
        *quant = 4;
    else {
        fprintf(stderr, "lmx: --quant '%s': want none, q8 or q4\n", v);
        return -1;
    }
    return 0;
}

int genopts_kv(const char *v, int *kv_f16)
{
    if (!strcmp(v, "f32"))
        *kv_f16 = 0;
    else if (!strcmp(v, "f16"))
        *kv_f16 = 1;
    else {
        fprintf(stderr, "lmx: --kv '%s': want f32 or f16\n", v);
        return -1;
    }
    return 0;
}

lmx_gen_config genopts_config(const genopts *g, const lmx_model *m)
{
    lmx_gen_config c = lmx_gen_defaults(m);
    if (g->has_max_tokens)
        c.max_tokens = g->max_tokens;
    if (g->has_temp)
        c.temperature = (float)g->temp;
    if (g->has_top_k)
        c.top_k = (int)g->top_k;
    if (g->has_top_p)
        c.top_p = (float)g->top_p;
    if (g->has_min_p)
        c.min_p = (float)g->min_p;
    if (g->has_repeat_penalty)
        c.repetition_penalty = (float)g->repeat_penalty;
    c.seed = g->has_seed ? g->seed : (unsigned long long)time(NULL) ^ ((unsigned long long)getpid() << 32);
    c.stop_strings = g->stops;
    c.n_stop_strings = g->n_stops;
    c.ignore_eos = g->ignore_eos;
    c.enable_thinking = !g->no_thinking;
    return c;
}

void genopts_print_stats(const lmx_stream *s)
{
    lmx_stats st;
    lmx_stream_stats(s, &st);
    fprintf(stderr,
            "\n[%s] prompt %d tokens (%d cached), generated %d; ttft %.3f s; prefill %.1f tok/s; "
            "decode %.1f tok/s; peak memory %.0f MB\n",
            lmx_stop_reason_name(lmx_stream_stop_reason(s)), st.prompt_tokens, st.cached_tokens,
            st.generated_tokens, st.ttft_s, st.prefill_tok_s, st.decode_tok_s, st.peak_rss_mb);
}
