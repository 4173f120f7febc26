#!/usr/bin/env bash
# tokamak serve over raw HTTP on 127.0.0.1 (tests/e2e/test_server.py): completions and
# chat, streamed and not, equal to tokamak run's greedy output; every bad input gets its
# status and an OpenAI-form error; 32 concurrent streams; 100 disconnects back to the
# metrics baseline; overload 429s; a slow reader; SIGTERM drains.
set -euo pipefail
: "${TK_CLI:?}" "${TK_TMP:?}" "${TK_SRC:?}" "${TK_PYTHON:=/usr/bin/python3}"
dir="$TK_TMP/e2e_server.$$"
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT

model="$TK_TMP/server_tiny_bf16.gguf"
if [ ! -s "$model" ]; then
  "$TK_CLI" synth --preset tiny --dtype bf16 -o "$model.tmp.$$" >/dev/null 2>&1
  mv "$model.tmp.$$" "$model"
fi
timeout 900 "$TK_PYTHON" "$TK_SRC/tests/e2e/test_server.py" "$TK_CLI" "$model" "$dir" || {
  rc=$?
  for f in "$dir"/server_*.log; do echo "--- $f"; tail -n 20 "$f"; done >&2
  exit $rc
}
