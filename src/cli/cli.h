/* One function per subcommand; each returns the process exit code
 * (0 ok, 1 runtime error, 2 usage error) and prints its own errors. */
#ifndef TK_CLI_H
#define TK_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

int cmd_synth(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_kvcheck(int argc, char **argv);
int cmd_quantize(int argc, char **argv);

/* Read all of f (at most limit bytes) into a NUL-terminated tk_malloc'd
 * buffer; NULL on a read error, no memory, or input over the limit. */
char *cli_read_all(FILE *f, size_t limit, size_t *len);

/* s as a whole decimal integer in [lo, hi] (no sign games, no trailing text). */
bool cli_parse_long(const char *s, long lo, long hi, long *out);

#endif
