/* Read-only file mapping shared by the GGUF and safetensors readers.
 *
 * A mapping is a plain value (no heap): fmap_open fills it, fmap_close unmaps it
 * and resets it, so closing twice or closing a zeroed one is a no-op. An empty
 * file maps to data == NULL, size == 0 (mmap rejects length 0); readers then fail
 * on their own "too short" check, which names the file's format.
 */
#ifndef TK_FORMAT_FMAP_H
#define TK_FORMAT_FMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokamak.h"

typedef struct tk_fmap {
    const uint8_t *data; /* (size) bytes, read-only; NULL when size == 0 */
    size_t size;
} tk_fmap;

/* TK_ERR_IO naming the path and errno text when the file cannot be opened,
 * is not a regular file ("not a regular file (a FIFO)": a FIFO, device or
 * directory is refused without blocking or reading it), or cannot be mapped. */
tk_status fmap_open(const char *path, tk_fmap *m);
void fmap_close(tk_fmap *m);

/* Read a whole (small) file into a NUL-terminated tk_malloc buffer: for JSON
 * files such as config.json. Files over max_bytes give TK_ERR_RANGE. Free the
 * result with tk_free. */
tk_status fmap_read_all(const char *path, size_t max_bytes, char **out, size_t *len);

#endif
