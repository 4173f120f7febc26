/* Shared by the tests CMakeLists.txt also runs at a lower ISA level
 * (<test>_<level>, TOKAMAK_ISA=<level> in its environment): the level the
 * kernels run at, and 77 (ctest's SKIP_RETURN_CODE) with a message when
 * TOKAMAK_ISA names a level this CPU or build lacks, whose run would
 * otherwise test the default level again under another name. */
#ifndef TK_TEST_ISA_LEVEL_H
#define TK_TEST_ISA_LEVEL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"
#include "kernels/kernels.h"

static inline const char *isa_level_name(void) { return cpu_isa_name(kernels_default()->isa); }

static inline int isa_level_skip(void) {
    const char *want = getenv("TOKAMAK_ISA");
    if (!want || !strcmp(want, isa_level_name())) return 0;
    printf("SKIP: TOKAMAK_ISA=%s: this CPU or build has no such level (the kernels run at %s)\n", want,
           isa_level_name());
    return 77;
}

#endif
