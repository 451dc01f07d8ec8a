/* The lmx subcommands: each is `int cmd_NAME(int argc, char **argv)` in
 * tools/cmd_NAME.c, where argv[0] is the subcommand's name; returns the
 * process exit status. */
#ifndef LMX_COMMANDS_H
#define LMX_COMMANDS_H

int cmd_bench(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_version(int argc, char **argv);

#endif
