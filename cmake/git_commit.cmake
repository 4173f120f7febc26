# Writes OUT (a header defining TK_GIT_COMMIT) from `git describe` at build
# time, touching it only when the commit changes, so reports never show a
# commit older than the build.
execute_process(COMMAND git describe --always --dirty --abbrev=10 WORKING_DIRECTORY ${SRC}
  OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT commit)
  set(commit unknown)
endif()
set(text "#define TK_GIT_COMMIT \"${commit}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE ${OUT} "${text}")
endif()
