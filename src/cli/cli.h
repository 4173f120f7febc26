/* One function per subcommand; each returns the process exit code
 * (0 ok, 1 runtime error, 2 usage error) and prints its own errors.
 * Options are parsed by cli/opts.h (included here: cli_opts, cli_parse_long, ...). */
#ifndef TK_CLI_H
#define TK_CLI_H

#include <stddef.h>
#include <stdio.h>

#include "cli/opts.h"
#include "tokamak.h"

int cmd_synth(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_kvcheck(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_loadgen(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_eval(int argc, char **argv);

/* Read all of f, at most limit bytes, into a NUL-terminated tk_malloc'd *buf
 * (free with tk_free) of *len bytes. Every input a subcommand reads whole goes
 * through here, so none reads without bound (a --prompts /dev/zero stops at
 * the limit). TK_ERR_RANGE past the limit, TK_ERR_IO on a read error,
 * TK_ERR_NOMEM; the message starts with what (the file's name). */
tk_status cli_read_all(FILE *f, const char *what, size_t limit, char **buf, size_t *len);

#endif
