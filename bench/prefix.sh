#!/usr/bin/env bash
# The prefix cache on a multi-turn conversation over `tokamak serve`.
#   bench/prefix.sh TOKAMAK_BINARY MODEL [serve options]
# Each turn resends the whole conversation as the prompt (token ids, through
# /v1/completions, streamed): about HISTORY tokens of history, then a new
# TURN-token user turn; the reply (REPLY tokens, greedy) and a REPLY-token
# stand-in for it join the history of the next turn. Two servers run side by
# side, one with the prefix cache and one with --no-prefix-cache, and the
# turns alternate between them, so background load falls on both alike.
# Turn 0 fills the cache (both servers prefill everything); the report is the
# TTFT of the later turns: per turn, P50 of each, and their ratio.
#
# Environment: TURNS (measured turns after turn 0, default 5), HISTORY
# (default 2000), TURN (default 50), REPLY (default 16), BLOCK (block size,
# default 128), THREADS (default 0: every core), PREFIX_JSON (write the
# samples there too). Extra arguments go to both servers.
# Python runs the client and the report only; the servers are the C binary.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 TOKAMAK_BINARY MODEL [serve options]" >&2
  exit 2
fi
bin=$1
model=$2
shift 2
[ -x "$bin" ] || { echo "prefix.sh: $bin is not an executable" >&2; exit 2; }
[ -f "$model" ] || { echo "prefix.sh: model $model does not exist" >&2; exit 2; }
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

start() { # name, extra options...
  local name=$1
  shift
  "$bin" serve -m "$model" --port 0 --block-size "${BLOCK:-128}" --threads "${THREADS:-0}" --max-seqs 2 \
    "$@" 2>"$dir/$name.log" &
  pids+=($!)
}
start cache "$@"
start nocache --no-prefix-cache "$@"

/usr/bin/python3 - "$dir" "${TURNS:-5}" "${HISTORY:-2000}" "${TURN:-50}" "${REPLY:-16}" "${PREFIX_JSON:-}" <<'EOF'
import http.client, json, random, re, statistics, sys, time

d, turns, history, turn, reply, out_json = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]

def port_of(name):
    for _ in range(600):
        with open("%s/%s.log" % (d, name)) as f:
            m = re.search(r"listening on http://[^:]+:(\d+)", f.read())
        if m:
            return int(m.group(1))
        time.sleep(0.1)
    sys.exit("prefix.sh: the %s server never said where it listens (see its log)" % name)

def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read().decode()

def wait_ready(name, port):
    for _ in range(3000):
        try:
            st, _ = get(port, "/health")
            if st == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit("prefix.sh: the %s server did not load the model" % name)

def complete(port, prompt):
    """Stream one completion; returns (TTFT seconds, e2e seconds, tokens)."""
    body = json.dumps({"prompt": prompt, "max_tokens": reply, "temperature": 0, "ignore_eos": True,
                       "stream": True, "logprobs": 1})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    t0 = time.monotonic()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        sys.exit("prefix.sh: completion answered %d: %s" % (r.status, r.read()[:300]))
    ttft, n = None, 0
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("choices") and ev["choices"][0].get("logprobs"):
            n += 1
            if ttft is None:
                ttft = time.monotonic() - t0
    e2e = time.monotonic() - t0
    if ttft is None:
        sys.exit("prefix.sh: the stream carried no token")
    return ttft, e2e, n

def metric(port, name):
    _, text = get(port, "/metrics")
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else float("nan")

ports = {n: port_of(n) for n in ("cache", "nocache")}
for n, p in ports.items():
    wait_ready(n, p)
rng = random.Random(1234)
V = 32000  # plain (non-special) ids of Qwen's vocabulary, which the synthetic models keep
conv = [rng.randrange(V) for _ in range(history)]
rows = []
for t in range(turns + 1):
    prompt = conv + [rng.randrange(V) for _ in range(turn)]
    res = {}
    for name in ("cache", "nocache"):
        res[name] = complete(ports[name], prompt)
    rows.append({"turn": t, "prompt_tokens": len(prompt), "ttft_cache_s": res["cache"][0],
                 "ttft_nocache_s": res["nocache"][0], "e2e_cache_s": res["cache"][1],
                 "e2e_nocache_s": res["nocache"][1]})
    print("turn %d: prompt %d tokens, TTFT %.3f s with the cache, %.3f s without" %
          (t, len(prompt), res["cache"][0], res["nocache"][0]), file=sys.stderr, flush=True)
    # The reply joins the history (a stand-in of the same length: the stream carries text, not ids).
    conv = prompt + [rng.randrange(V) for _ in range(reply)]

later = rows[1:]
p50c = statistics.median(r["ttft_cache_s"] for r in later)
p50n = statistics.median(r["ttft_nocache_s"] for r in later)
hits = metric(ports["cache"], "tokamak_prefix_cache_hits_tokens_total")
queries = metric(ports["cache"], "tokamak_prefix_cache_queries_tokens_total")
print("| turn | prompt tokens | TTFT, prefix cache (s) | TTFT, --no-prefix-cache (s) | ratio |")
print("|---:|---:|---:|---:|---:|")
for r in rows:
    print("| %d%s | %d | %.3f | %.3f | %.1fx |" % (r["turn"], " (fills the cache)" if r["turn"] == 0 else "",
          r["prompt_tokens"], r["ttft_cache_s"], r["ttft_nocache_s"], r["ttft_nocache_s"] / r["ttft_cache_s"]))
print()
print("TTFT P50 over turns 1..%d: %.3f s with the prefix cache, %.3f s without: %.1fx lower" %
      (turns, p50c, p50n, p50n / p50c))
print("prefix cache: %d of %d prompt tokens hit (%.1f%%)" % (hits, queries, 100.0 * hits / queries if queries else 0))
if out_json:
    with open(out_json, "w") as f:
        json.dump({"rows": rows, "ttft_p50_cache_s": p50c, "ttft_p50_nocache_s": p50n, "ratio": p50n / p50c,
                   "hit_tokens": hits, "query_tokens": queries, "history": history, "turn": turn,
                   "reply": reply}, f, indent=1)
EOF
