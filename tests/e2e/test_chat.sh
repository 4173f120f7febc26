#!/usr/bin/env bash
# tokamak chat on a one-layer synthetic Qwen3 (real tokenizer and chat
# template, random weights, greedy): the first reply is `run --chat`'s; after
# /reset the same message gives the same reply from a runner rolled back to
# the conversation's start (F16 KV, and INT8 per-head KV whose block is
# written afresh), and the second turn's reply is the same again; a message
# that no longer fits the context is refused and the chat goes on; a line past
# 1 MiB is skipped, empty and CRLF lines; commands, continued lines, end of
# input; Ctrl-C stops a reply and the chat goes on,
# and at the prompt ends the chat (130); bad options and a missing model.
set -euo pipefail
: "${TK_CLI:?}"
TK_TMP="${TK_TMP:-/tmp}"
mkdir -p "$TK_TMP"
W=$(mktemp -d "$TK_TMP/chat.XXXXXX")
trap 'rm -rf "$W"' EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}
"$TK_CLI" synth --preset tiny --dtype q8_0 --layers 1 --n-ctx 16384 -o "$W/m.gguf" 2>/dev/null
M="$W/m.gguf"
chat() { "$TK_CLI" chat -m "$M" --threads 2 --temp 0 "$@"; }

# the first reply is run --chat's
"$TK_CLI" run -m "$M" --threads 2 --temp 0 --chat -p "hello there" -n 12 --no-probe >"$W/run.out" 2>/dev/null
printf 'hello there\n' | chat -n 12 -q >"$W/chat.out" 2>"$W/chat.err" || fail "chat exited $?"
cmp -s "$W/run.out" "$W/chat.out" || {
    diff "$W/run.out" "$W/chat.out" | head
    fail "chat's first reply differs from run --chat's"
}

# /reset: the same replies again, the first from a rolled-back runner
for kv in "--kv-type f16" "--kv-type int8 --kv-scale head"; do
    # shellcheck disable=SC2086
    printf 'hello there\nwhat next\n/reset\nhello there\nwhat next\n' |
        chat -n 12 $kv --block-size 16 >"$W/r.out" 2>"$W/r.err" || fail "$kv: chat exited $?"
    [ "$(wc -l <"$W/r.out")" -eq 4 ] || fail "$kv: $(wc -l <"$W/r.out") reply lines, expected 4"
    [ "$(sed -n 1p "$W/r.out")" = "$(sed -n 3p "$W/r.out")" ] || fail "$kv: the first reply after /reset differs"
    [ "$(sed -n 2p "$W/r.out")" = "$(sed -n 4p "$W/r.out")" ] || fail "$kv: the second reply after /reset differs"
    grep -q "the conversation starts over" "$W/r.err" || fail "$kv: /reset said nothing"
    # after /reset only the last prompt token is fed again
    [ "$(grep -c '^\[1 new of ' "$W/r.err")" -eq 1 ] || {
        cat "$W/r.err"
        fail "$kv: the turn after /reset fed more than one token"
    }
done

# a message past the context is refused, and a short one after it runs
long=$(printf 'word %.0s' $(seq 200))
printf '%s\nhi\n' "$long" | chat --ctx 64 -n 4 >"$W/o.out" 2>"$W/o.err" || fail "overflow: chat exited $?"
grep -q "past --ctx 64" "$W/o.err" || fail "overflow: no message"
[ "$(wc -l <"$W/o.out")" -eq 1 ] || fail "overflow: $(wc -l <"$W/o.out") replies, expected the short one's"

# commands, a continued line, the end of input
printf '/help\n/bogus\none\\\ntwo\n/quit\nnever read\n' | chat -n 4 >"$W/c.out" 2>"$W/c.err" || fail "commands: exited $?"
grep -q "/reset" "$W/c.err" || fail "/help lists no commands"
grep -q "unknown command '/bogus'" "$W/c.err" || fail "/bogus: no message"
[ "$(grep -c 'prompt tokens' "$W/c.err")" -eq 1 ] || fail "a continued line is not one message (or /quit did not stop)"
printf '' | chat -q >"$W/e.out" 2>&1 || fail "empty input: exited $?"
# a message past 1 MiB is skipped without being held; empty lines are no messages; CRLF ends a line
{
    head -c 2200000 /dev/zero | tr '\0' 'a'
    printf '\n\n\r\nhi\r\n'
} | chat -n 4 >"$W/big.out" 2>"$W/big.err" || fail "a long line: exited $?"
grep -q "more than 1048576 bytes is skipped" "$W/big.err" || fail "a long line: no message"
[ "$(grep -c 'prompt tokens' "$W/big.err")" -eq 1 ] || fail "a long line: not one reply, to 'hi'"

# Ctrl-C: a reply stops where it is and the chat goes on; at the prompt it ends the chat
mkfifo "$W/in"
"$TK_CLI" chat -m "$M" --threads 2 --temp 0 --ctx 16384 <"$W/in" >"$W/i.out" 2>"$W/i.err" &
pid=$!
exec 3>"$W/in"
echo "hello there" >&3
for _ in $(seq 100); do [ -s "$W/i.out" ] && break; sleep 0.1; done
[ -s "$W/i.out" ] || fail "no reply began"
kill -INT "$pid"
for _ in $(seq 100); do grep -q '\[stopped\]' "$W/i.err" && break; sleep 0.1; done
grep -q '\[stopped\]' "$W/i.err" || fail "Ctrl-C did not stop the reply"
echo "what next" >&3
for _ in $(seq 100); do [ "$(wc -l <"$W/i.out")" -ge 1 ] && [ "$(wc -c <"$W/i.out")" -gt "$(head -1 "$W/i.out" | wc -c)" ] && break; sleep 0.1; done
kill -INT "$pid" # the second reply
for _ in $(seq 100); do [ "$(grep -c '\[stopped\]' "$W/i.err")" -ge 2 ] && break; sleep 0.1; done
[ "$(grep -c '\[stopped\]' "$W/i.err")" -ge 2 ] || fail "Ctrl-C did not stop the second reply"
sleep 0.2
kill -INT "$pid" # at the prompt
set +e
wait "$pid"
rc=$?
set -e
exec 3>&-
[ "$rc" -eq 130 ] || {
    cat "$W/i.err"
    fail "Ctrl-C at the prompt: exited $rc, expected 130"
}

# bad options, a missing model
# expect RC PATTERN ARGS...: tokamak chat ARGS exits RC with PATTERN on stderr
expect() {
    local want=$1 pat=$2
    shift 2
    set +e
    "$TK_CLI" chat "$@" </dev/null >/dev/null 2>"$W/b.err"
    local rc=$?
    set -e
    [ "$rc" -eq "$want" ] || fail "chat $*: exited $rc, expected $want: $(cat "$W/b.err")"
    grep -q -- "$pat" "$W/b.err" || fail "chat $*: stderr lacks '$pat': $(cat "$W/b.err")"
}
expect 2 "-m MODEL is required"
expect 2 "a chat is one sequence" -m "$M" --kv-mem 64M
expect 2 "\-n" -m "$M" -n -1
expect 1 "cannot load the model" -m "$W/missing.gguf"
echo "chat: ok"
