/* The lmx command: dispatches to one subcommand per tools/cmd_*.c. */
#include <stdio.h>
#include <string.h>

#include "commands.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"chat", cmd_chat, "chat DIR [options]            interactive chat"},
    {"info", cmd_info, "info DIR                      describe a checkpoint"},
    {"logits", cmd_logits, "logits DIR --ids 1,2,3 --out F.safetensors [--decode] [--chunk N]"},
    {"run", cmd_run, "run DIR -p TEXT [--chat] [--json] [-n N] [--temp F] ...   generate text"},
    {"bench", cmd_bench,
     "bench DIR [--prompt N] [--gen N] [--threads T] [--quant none|q8|q4] [--kv f32|f16] [--mmap] [--prefill-bf16]"
     " [--json]"},
    {"synth", cmd_synth, "synth --like NAME DIR [--dtype bf16|f16|f32] [--layers N] [--seed S]"},
    {"tokenize", cmd_tokenize, "tokenize DIR [--no-special] [--plain-special] [--jsonl]  text -> ids"},
    {"detokenize", cmd_detokenize, "detokenize DIR [--skip-special] [--jsonl]  ids -> text"},
    {"template", cmd_template, "template DIR --messages F.json [--no-generation-prompt] [--no-thinking]"},
    {"version", cmd_version, "version                       print the version"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: lmx COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %s\n", commands[i].help);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "lmx: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
