/* One function per subcommand; each returns the process exit code
 * (0 ok, 1 runtime error, 2 usage error) and prints its own errors. */
#ifndef TK_CLI_H
#define TK_CLI_H

int cmd_synth(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);

#endif
