#!/usr/bin/env bash
# The library is what an embedding program links: no source of libtokamak
# includes the tool code (src/bench, src/cli, src/server), and the built
# archive runs no shell commands and starts no processes.
set -euo pipefail
: "${TK_SRC:?}" "${TK_BUILD:?}"
fail() { echo "FAIL: $*" >&2; exit 1; }

lib_dirs="core format model kernels kv backend engine tokenizer"
for d in $lib_dirs; do
  [ -d "$TK_SRC/src/$d" ] || fail "src/$d is missing"
done
bad=$(cd "$TK_SRC/src" && grep -rnE '#include "(bench|cli|server)/' $lib_dirs || true)
[ -z "$bad" ] || fail "library sources include tool code:
$bad"

lib="$TK_BUILD/libtokamak.a"
[ -s "$lib" ] || fail "$lib not built"
command -v nm >/dev/null || fail "nm not found"
calls=$(nm -u "$lib" | awk '{print $2}' | grep -xE 'system|popen|fork|vfork|execv|execvp|execve|posix_spawn|posix_spawnp' | sort -u || true)
[ -z "$calls" ] || fail "libtokamak.a calls $(echo $calls)"
# The check can see such a call: the tool archive has one (gnuplot). The
# symbols are read whole first: grep -q at the end of a pipe exits at its first
# match, and under pipefail the writer's SIGPIPE would fail the pipe.
tool_calls=$(nm -u "$TK_BUILD/libtokamak_tools.a" | awk '{print $2}')
grep -qxE "system|popen|posix_spawnp?" <<<"$tool_calls" || fail "nm sees no process call in libtokamak_tools.a (its gnuplot call)"
echo "ok: libtokamak holds no tool code"
