/* One name table per enum that the command line, the reports and the server
 * spell out: parsing a name, printing a value and listing the choices in
 * --help all read the same rows, so a new KV type or weight type is one row.
 * The tables are constant; every call is pure and thread-safe. */
#ifndef TK_CORE_NAMES_H
#define TK_CORE_NAMES_H

#include <stdbool.h>
#include <stddef.h>

typedef struct names_row {
    const char *name;
    int value;
} names_row;

/* Either rows, or (rows NULL) the names name(v) of the values v in [0, n)
 * where the enum keeps its own table (tk_weight_type_name). */
typedef struct names_table {
    const char *what; /* "KV type", for messages */
    const names_row *rows;
    int n;
    const char *(*name)(int value); /* NULL for a value without a name */
} names_table;

extern const names_table NAMES_KV_TYPE;  /* tk_kv_type: f32 f16 bf16 int8 */
extern const names_table NAMES_KV_SCALE; /* tk_kv_scale: head token */
extern const names_table NAMES_SPEC;     /* tk_spec_mode: off ngram draft */
extern const names_table NAMES_FINISH;   /* tk_finish: none stop length cancelled error */
extern const names_table NAMES_WEIGHTS;  /* tk_weight_type (tk_model_opts.repack), from tk_weight_type_name */

/* The value named s; false (and *value untouched) when no row has that name. */
bool names_find(const names_table *t, const char *s, int *value);
/* The name of value, or "?" when no row has it (never NULL). */
const char *names_str(const names_table *t, int value);
/* "f32, f16, bf16, int8" (the names joined by sep) into buf of n bytes, cut
 * to fit and always NUL-terminated when n > 0; returns buf. */
char *names_list(const names_table *t, const char *sep, char *buf, size_t n);

#endif
