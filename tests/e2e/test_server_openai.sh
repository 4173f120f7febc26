#!/usr/bin/env bash
# tokamak serve through the official openai npm client (tests/e2e/test_server_openai.js):
# completions and chat, whole and streamed, models, and typed errors.
set -euo pipefail
: "${TK_CLI:?}" "${TK_TMP:?}" "${TK_SRC:?}" "${TK_CACHE:?}"
NM="$TK_CACHE/npm/node_modules"
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -f "$NM/openai/package.json" ] || fail "no openai client in $NM (run scripts/deps.sh)"
command -v node >/dev/null || fail "node is not installed"
dir="$TK_TMP/e2e_server_openai.$$"
mkdir -p "$dir"
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill "$pid"; wait "$pid" || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT

model="$TK_TMP/server_openai_tiny_bf16.gguf"
if [ ! -s "$model" ]; then
  "$TK_CLI" synth --preset tiny --dtype bf16 -o "$model.tmp.$$" >/dev/null 2>&1
  mv "$model.tmp.$$" "$model"
fi
"$TK_CLI" serve -m "$model" --port 0 --threads 1 --ctx 128 --api-key k3y --served-model-name tiny \
  2>"$dir/log" &
pid=$!
port=""
for _ in $(seq 600); do
  port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$dir/log")
  [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  kill -0 "$pid" 2>/dev/null || { cat "$dir/log" >&2; fail "server exited"; }
  sleep 0.1
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || fail "server not ready"
timeout 300 node "$TK_SRC/tests/e2e/test_server_openai.js" "$NM" "$port" k3y tiny || { cat "$dir/log" >&2; exit 1; }
kill -TERM "$pid"
wait "$pid" || fail "server exit code $?"
pid=""
