#!/usr/bin/env bash
# tokamak loadgen against tokamak serve on 127.0.0.1 (tests/e2e/test_loadgen.py):
# closed-loop and Poisson runs whose prompts are exactly --in tokens (the
# server's own prompt-token counter agrees), output lengths from usage, the
# report's figures consistent with its raw samples, background streams closed
# when a run ends (the server returns to no running request), failures counted
# by HTTP status, and bad options refused.
set -euo pipefail
: "${TK_CLI:?}" "${TK_TMP:?}" "${TK_SRC:?}" "${TK_PYTHON:=/usr/bin/python3}"
dir="$TK_TMP/e2e_loadgen.$$"
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT

model="$TK_TMP/server_tiny_bf16.gguf"
if [ ! -s "$model" ]; then
  "$TK_CLI" synth --preset tiny --dtype bf16 -o "$model.tmp.$$" >/dev/null 2>&1
  mv "$model.tmp.$$" "$model"
fi
timeout 600 "$TK_PYTHON" "$TK_SRC/tests/e2e/test_loadgen.py" "$TK_CLI" "$model" "$dir" || {
  rc=$?
  for f in "$dir"/*.log "$dir"/*.err; do [ -f "$f" ] && { echo "--- $f"; tail -n 20 "$f"; }; done >&2
  exit $rc
}
