#include "fmap.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"

static const char *file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a plain file";
}

tk_status fmap_open(const char *path, tk_fmap *m) {
    m->data = NULL;
    m->size = 0;
    /* Non-blocking, so opening a FIFO (or a device) returns at once instead of
     * waiting for a writer; fstat on the open descriptor then refuses it. The
     * flag changes nothing for a regular file. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return tk_fail(TK_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return tk_fail(TK_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tk_fail(TK_ERR_IO, "%s: not a regular file (%s)", path, file_kind(st.st_mode));
    }
    if (st.st_size == 0) {
        close(fd);
        return TK_OK;
    }
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return tk_fail(TK_ERR_IO, "%s: file too large to map (%lld bytes)", path, (long long)st.st_size);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the file alive */
    if (p == MAP_FAILED) return tk_fail(TK_ERR_IO, "%s: cannot map: %s", path, strerror(e));
    m->data = p;
    m->size = (size_t)st.st_size;
    return TK_OK;
}

void fmap_close(tk_fmap *m) {
    if (!m) return;
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

tk_status fmap_read_all(const char *path, size_t max_bytes, char **out, size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    tk_fmap m;
    tk_status st = fmap_open(path, &m);
    if (st != TK_OK) return st;
    if (m.size > max_bytes) {
        size_t n = m.size;
        fmap_close(&m);
        return tk_fail(TK_ERR_RANGE, "%s: %zu bytes, more than the %zu allowed", path, n, max_bytes);
    }
    char *buf = tk_malloc(m.size + 1);
    if (!buf) {
        fmap_close(&m);
        return tk_fail(TK_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, m.size + 1);
    }
    if (m.size) memcpy(buf, m.data, m.size);
    buf[m.size] = 0;
    if (len) *len = m.size;
    fmap_close(&m);
    *out = buf;
    return TK_OK;
}
