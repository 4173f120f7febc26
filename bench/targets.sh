#!/usr/bin/env bash
# `make bench-targets`: the decode targets on this machine, in alternating
# rounds with medians, each figure against the same run's probe:
#   - one sequence (`tokamak run`, 8-token prompt, 128 new tokens): the
#     decode's weight and KV reads as a share of the run's probe (its best
#     pass, and its median pass), for Q8_0, BF16, Q4_0 and the Q4_K_M file
#     (targets: >= 90% for Q8_0 and BF16, >= 85% for the 4-bit files);
#   - 8 and 32 sequences (`tokamak profile`, Q8_0, INT8 KV with per-head and
#     per-token scales, context 576): the decode step over its floor (per
#     stage the larger of bytes / bandwidth and operations / peak), at the
#     probe's best pass and at its median pass (target: <= 1.5).
#   bench/targets.sh TOKAMAK_BINARY MODEL_DIR [ROUNDS]
# Missing models are made with `tokamak synth` (PRESET-TYPE.gguf in
# MODEL_DIR). Each round runs every configuration once, in reverse order
# every other round, so a machine whose memory speed drifts is compared
# fairly. Runs at `nice -n -20` where that is allowed (NICE=0: never), so
# other jobs get few time slices mid-run; not under `chrt -f 1`: the kernel
# throttles real-time threads that keep every core busy (sched_rt_runtime_us,
# 950 of each 1,000 ms by default), a ~50 ms stall each second that a
# decode's mean read rate counts (docs/benchmarking.md). The level is the
# machine's best unless TOKAMAK_ISA says otherwise (e.g. TOKAMAK_ISA=avx2).
# Environment: THREADS (2), PRESET (qwen3-0.6b), CTX (576), STEPS (12),
# NEW_TOKENS (128), BATCHES ("8 32"), NICE (1); the targets TARGET_READ (90, %
# of the probe for Q8_0 and BF16), TARGET_READ_4BIT (85) and TARGET_FLOOR
# (1.5, step / floor).
set -euo pipefail
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
    echo "usage: $0 TOKAMAK_BINARY MODEL_DIR [ROUNDS]" >&2
    exit 2
fi
bin=$1
dir=$2
rounds=${3:-3}
threads=${THREADS:-2}
preset=${PRESET:-qwen3-0.6b}
ctx=${CTX:-576}
steps=${STEPS:-12}
new=${NEW_TOKENS:-128}
batches=${BATCHES:-8 32}
t_read=${TARGET_READ:-90}
t_read4=${TARGET_READ_4BIT:-85}
t_floor=${TARGET_FLOOR:-1.5}
case "$rounds" in '' | *[!0-9]* | 0)
    echo "$0: ROUNDS must be a positive integer, got '$rounds'" >&2
    exit 2
    ;;
esac
[ -x "$bin" ] || {
    echo "$0: $bin is not an executable" >&2
    exit 2
}
mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# nice lowers the value without permission but not below 0: check it took
prio=()
if [ "${NICE:-1}" != 0 ] && [ "$(nice -n -20 nice 2>/dev/null)" = -20 ]; then prio=(nice -n -20); fi

types=(q8_0 bf16 q4_0 q4_k_m)
for t in "${types[@]}"; do
    m="$dir/$preset-$t.gguf"
    if [ ! -f "$m" ]; then
        echo "targets: making $m" >&2
        "$bin" synth --preset "$preset" --dtype "$t" -o "$m" >"$work/synth.txt" 2>&1 || {
            echo "targets: tokamak synth --preset $preset --dtype $t failed:" >&2
            tail -5 "$work/synth.txt" >&2
            exit 1
        }
    fi
done

# Configurations: "run TYPE" or "profile BATCH SCALE".
configs=()
for t in "${types[@]}"; do configs+=("run $t"); done
for b in $batches; do for s in head token; do configs+=("profile $b $s"); done; done

# One configuration once: appends a line to $work/results, tab-separated: the
# configuration, its figure at the probe's best pass and at its median pass
# (% of the probe, or step / floor), the probe's best pass (GB/s), and the
# run's read rate (GB/s) or the step (ms).
one() {
    local kind=$1 out="$work/out.txt"
    if [ "$kind" = run ]; then
        local t=$2
        if ! "${prio[@]}" "$bin" run -m "$dir/$preset-$t.gguf" --tokens 1,2,3,4,5,6,7,8 -n "$new" \
            --threads "$threads" --ignore-eos >"$out" 2>&1; then
            echo "targets: tokamak run -m $dir/$preset-$t.gguf failed:" >&2
            tail -5 "$out" >&2
            exit 1
        fi
        # "... | 52.59 GB/s = 84.3% of 62.39 GB/s probe (best of 9 passes;
        # 91.0% of the median pass, 57.80 GB/s) | ..." or, where the decode
        # read faster than the probe, "... | 62.73 GB/s > the 59.33 GB/s probe (...)"
        awk -v c="run $t" '
            match($0, /[0-9.]+ GB\/s (= [0-9.]+% of|> the) [0-9.]+ GB\/s probe/) {
                n = split(substr($0, RSTART, RLENGTH), f, " ")
                got = f[1]; probe = f[n - 2]
            }
            match($0, /[0-9.]+% of the median pass/) { med = substr($0, RSTART, RLENGTH) + 0 }
            END {
                if (got == "" || probe + 0 <= 0) exit 1
                best = 100 * got / probe
                printf "%s\t%.2f\t%.2f\t%s\t%s\n", c, best, (med > 0 ? med : best), probe, got
            }' "$out" >>"$work/results" || {
            echo "targets: no read rate in tokamak run's output:" >&2
            tail -5 "$out" >&2
            exit 1
        }
    else
        local b=$2 s=$3
        if ! "${prio[@]}" "$bin" profile -m "$dir/$preset-q8_0.gguf" --batch "$b" --ctx "$ctx" --kv-type int8 \
            --kv-scale "$s" --steps "$steps" --threads "$threads" >"$out" 2>&1; then
            echo "targets: tokamak profile --batch $b --kv-scale $s failed:" >&2
            tail -5 "$out" >&2
            exit 1
        fi
        # the step row's ms and floor ms, the floors at the probe's median
        # pass, and the probe's best pass
        awk -F'|' -v c="profile $b $s" '
            /^- probe \(/ { if (match($0, /read [0-9.]+ GB\/s/)) pr = substr($0, RSTART + 5, RLENGTH - 10) }
            { g = $2; gsub(/[ *]/, "", g) }
            g == "step" { ms = $3; fl = $12; gsub(/[ *]/, "", ms); gsub(/[ *]/, "", fl) }
            /floors sum to/ { if (match($0, /sum to [0-9.]+ ms/)) fm = substr($0, RSTART + 7, RLENGTH - 10) }
            END {
                if (ms == "" || fl == "" || fl + 0 <= 0) exit 1
                if (fm == "") fm = fl
                printf "%s\t%.4f\t%.4f\t%s\t%s\n", c, ms / fl, ms / fm, pr, ms
            }' "$out" >>"$work/results" || {
            echo "targets: no step row in tokamak profile's output:" >&2
            tail -5 "$out" >&2
            exit 1
        }
    fi
}

for r in $(seq 1 "$rounds"); do
    echo "targets: round $r of $rounds" >&2
    order=("${configs[@]}")
    if [ $((r % 2)) = 0 ]; then
        order=()
        for ((i = ${#configs[@]} - 1; i >= 0; i--)); do order+=("${configs[$i]}"); done
    fi
    for c in "${order[@]}"; do
        # shellcheck disable=SC2086
        one $c
    done
done

echo "# tokamak decode targets"
echo
echo "- $(date -u +%Y-%m-%d), ${rounds} rounds, ${threads} threads, ISA level ${TOKAMAK_ISA:-the best this machine has}, models $dir/$preset-*.gguf$([ ${#prio[@]} -gt 0 ] && echo ', at nice -20')"
echo "- one sequence: \`tokamak run -m MODEL --tokens 1,2,3,4,5,6,7,8 -n $new --threads $threads --ignore-eos\`, its read rate as a share of its probe's best and median pass"
echo "- batches: \`tokamak profile -m $preset-q8_0.gguf --batch B --ctx $ctx --kv-type int8 --kv-scale S --steps $steps --threads $threads\`, the step over its floor at the probe's best and median pass"
echo
echo "| configuration | target | median | range | each round | met (median) |"
echo "|---|---|---:|---:|---|---|"
awk -F'\t' -v tr="$t_read" -v tr4="$t_read4" -v tf="$t_floor" -v cfgs="$(printf '%s\n' "${configs[@]}")" '
    function sort(a, n,    i, j, t) { for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t } }
    function median(a, n) { return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
    { n[$1]++; v[$1, n[$1]] = $2; w[$1, n[$1]] = $3; p[$1, n[$1]] = $4; x[$1, n[$1]] = $5 }
    END {
        nc = split(cfgs, cs, "\n")
        for (c = 1; c <= nc; c++) {
            k = cs[c]; m = n[k]
            if (!m) continue
            split(k, f, " ")
            delete a; delete b
            each = ""
            for (i = 1; i <= m; i++) {
                a[i] = v[k, i]; b[i] = w[k, i]
                if (f[1] == "run") each = each (i > 1 ? ", " : "") sprintf("%.1f%% (%s of %s GB/s)", v[k, i], x[k, i], p[k, i])
                else each = each (i > 1 ? ", " : "") sprintf("%s ms (probe %s)", x[k, i], p[k, i])
            }
            sort(a, m); sort(b, m)
            if (f[1] == "run") {
                tgt = (f[2] == "q8_0" || f[2] == "bf16") ? tr : tr4
                printf "| batch 1, %s: decode read, %% of the probe (best pass; median pass) | >= %s%% | %.1f%% (%.1f%%) | %.1f–%.1f%% (%.1f–%.1f%%) | %s | %s |\n", f[2], tgt, median(a, m), median(b, m), a[1], a[m], b[1], b[m], each, (median(a, m) >= tgt + 0 ? "yes" : (median(b, m) >= tgt + 0 ? "at the median pass" : "no"))
            } else {
                printf "| batch %s, Q8_0, INT8 KV per %s: step / floor (best pass; median pass) | <= %s | %.2f (%.2f) | %.2f–%.2f (%.2f–%.2f) | %s | %s |\n", f[2], f[3], tf, median(a, m), median(b, m), a[1], a[m], b[1], b[m], each, (median(a, m) <= tf + 0 ? "yes" : (median(b, m) <= tf + 0 ? "at the median pass" : "no"))
            }
        }
    }' "$work/results"
