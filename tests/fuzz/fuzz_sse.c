/* libFuzzer target: the loadgen's stream reader on arbitrary server bytes.
 * The first byte picks where the input is cut in two reads; every event's
 * data goes through the frame parser. Reading must end, never crash, and a
 * frame's counts must be -1 or sane. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bench/loadgen.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool on_event(void *user, const char *d, size_t n) {
    (void)user;
    lg_frame f;
    lg_frame_parse(d, n, &f);
    if (f.completion_tokens < -1 || f.prompt_tokens < -1 || memchr(f.error, 0, sizeof f.error) == NULL)
        abort();
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t cut = data[0] % size;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    if (cut > n) cut = n;
    lg_sse p = {0};
    if (lg_sse_feed(&p, s, cut, on_event, NULL)) lg_sse_feed(&p, s + cut, n - cut, on_event, NULL);
    lg_sse_free(&p);
    return 0;
}
