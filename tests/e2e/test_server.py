"""tokamak serve end to end over raw HTTP on 127.0.0.1 (driven by test_server.sh).

usage: test_server.py CLI MODEL WORKDIR

Every server runs on an ephemeral port with a tiny synthetic model; every loop
is bounded in count and time."""
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

CLI, MODEL, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
KEY = "sekret-key"
NAME = "tiny"
PROMPT = [9707, 11, 1879, 374, 264, 1273, 315, 279]  # token ids, all inside the vocabulary


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


class Server:
    def __init__(self, *extra, key=KEY, tag="main"):
        self.log_path = os.path.join(WORK, "server_%s.log" % tag)
        self.log = open(self.log_path, "wb")
        args = [CLI, "serve", "-m", MODEL, "--port", "0", "--threads", "1", "--ctx", "128",
                "--served-model-name", NAME] + (["--api-key", key] if key else []) + list(extra)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=self.log)
        self.key = key
        self.port = None
        deadline = time.time() + 60
        while time.time() < deadline and self.port is None:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(self.log_path).read())
            if m:
                self.port = int(m.group(1))
            elif self.proc.poll() is not None:
                fail("server exited at start: " + open(self.log_path).read())
            else:
                time.sleep(0.05)
        check(self.port, "server printed no port")
        while time.time() < deadline:
            st, _, _ = self.request("GET", "/health")
            if st == 200:
                return
            check(st == 503, "health while loading gave %s" % st)
            time.sleep(0.1)
        fail("server never became ready")

    def headers(self, auth=True):
        h = {"Content-Type": "application/json"}
        if auth and self.key:
            h["Authorization"] = "Bearer " + self.key
        return h

    def request(self, method, path, body=None, headers=None, timeout=60):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            c.request(method, path, body=data, headers=self.headers() if headers is None else headers)
            r = c.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            c.close()

    def post(self, path, body, **kw):
        st, h, data = self.request("POST", path, body, **kw)
        return st, h, json.loads(data) if data else None

    def stream(self, path, body, timeout=120):
        """The raw SSE frames (bytes) of a streaming request."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request("POST", path, body=json.dumps(body).encode(), headers=self.headers())
            r = c.getresponse()
            if r.status != 200:
                fail("stream %s: status %s %s" % (path, r.status, r.read()[:300]))
            check(r.getheader("Content-Type") == "text/event-stream", "stream content type")
            raw = r.read()
        finally:
            c.close()
        check(raw.endswith(b"data: [DONE]\n\n"), "stream does not end with [DONE]: %r" % raw[-80:])
        frames = raw.split(b"\n\n")
        check(frames[-1] == b"", "stream does not end with a blank line")
        out = []
        for f in frames[:-1]:
            check(f.startswith(b"data: "), "frame without 'data: ': %r" % f[:80])
            payload = f[6:]
            if payload == b"[DONE]":
                continue
            # No frame splits a UTF-8 character: every frame's bytes decode strictly.
            try:
                text = payload.decode("utf-8", errors="strict")
            except UnicodeDecodeError as e:
                fail("frame is not valid UTF-8: %s" % e)
            out.append(json.loads(text))
        return out

    def metrics(self):
        st, _, data = self.request("GET", "/metrics")
        check(st == 200, "metrics status %s" % st)
        m = {}
        for line in data.decode().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            k, v = line.rsplit(" ", 1)
            m[k] = float(v)
        return m

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if sig is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            fail("server did not exit within %ss of signal %s" % (timeout, sig))
        self.log.close()
        return rc


def stream_text(frames, chat):
    text, reasoning, finish, usage = "", "", None, None
    for f in frames:
        if f.get("usage"):
            usage = f["usage"]
        for ch in f["choices"]:
            if chat:
                text += ch["delta"].get("content") or ""
                reasoning += ch["delta"].get("reasoning_content") or ""
            else:
                text += ch["text"]
            finish = ch["finish_reason"] or finish
    return text, reasoning, finish, usage


def check_error(st, body, want, what, param=None):
    check(st == want, "%s: status %s, want %s (%s)" % (what, st, want, body))
    check(isinstance(body, dict) and isinstance(body.get("error"), dict), "%s: no error object: %s" % (what, body))
    e = body["error"]
    for k in ("message", "type", "param", "code"):
        check(k in e, "%s: error lacks %s: %s" % (what, k, e))
    check(isinstance(e["message"], str) and e["message"], "%s: empty message" % what)
    if param:
        check(e["param"] == param, "%s: param %r, want %r" % (what, e["param"], param))
    return e


def run_cli(ids, n):
    out = subprocess.run([CLI, "run", "-m", MODEL, "--tokens", ",".join(map(str, ids)), "-n", str(n),
                          "--threads", "1", "--no-probe"], capture_output=True, timeout=120)
    check(out.returncode == 0, "tokamak run failed: %s" % out.stderr.decode())
    return out.stdout.decode()[:-1]  # run ends with a newline


# ---------------------------------------------------------------------------------------------
def test_basic(s):
    st, _, data = s.request("GET", "/v1/models")
    models = json.loads(data)
    check(st == 200 and models["data"][0]["id"] == NAME, "models: %s" % models)
    st, _, body = s.post("/v1/completions", {"model": NAME, "prompt": PROMPT, "max_tokens": 12, "temperature": 0})
    check(st == 200, "completion: %s %s" % (st, body))
    ch = body["choices"][0]
    check(body["object"] == "text_completion" and ch["finish_reason"] in ("length", "stop"), "completion shape")
    u = body["usage"]
    check(u["prompt_tokens"] == len(PROMPT) and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"],
          "usage: %s" % u)
    # The server's greedy output is tokamak run's for the same prompt ids.
    want = run_cli(PROMPT, 12)
    if ch["finish_reason"] == "length":
        check(u["completion_tokens"] == 12, "usage counts %s tokens for max_tokens 12" % u["completion_tokens"])
        check(ch["text"] == want, "server %r != run %r" % (ch["text"], want))
    # Streaming gives the same text, in valid frames.
    frames = s.stream("/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "stream": True, "temperature": 0,
                                          "stream_options": {"include_usage": True}})
    text, _, finish, usage = stream_text(frames, False)
    check(text == ch["text"] and finish == ch["finish_reason"], "stream %r != %r" % (text, ch["text"]))
    check(usage == u, "stream usage %s != %s" % (usage, u))
    check(frames[-1]["choices"] == [] and frames[-1]["usage"] == u, "include_usage: last frame %s" % frames[-1])
    # A text prompt, and the tokenizer endpoints under both names.
    st, _, tok = s.post("/tokenize", {"prompt": "Hello world"})
    st2, _, tok2 = s.post("/tokenize", {"content": "Hello world"})
    check(st == 200 and st2 == 200 and tok["tokens"] == tok2["tokens"] and tok["count"] == len(tok["tokens"]),
          "tokenize: %s %s" % (tok, tok2))
    st, _, de = s.post("/detokenize", {"tokens": tok["tokens"]})
    check(st == 200 and de["prompt"] == "Hello world" and de["content"] == "Hello world", "detokenize: %s" % de)
    st, _, body = s.post("/v1/completions", {"prompt": "Hello world", "max_tokens": 4})
    check(st == 200 and body["usage"]["prompt_tokens"] == len(tok["tokens"]), "text prompt: %s" % body)


def test_chat(s):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Hello!"}]
    req = {"model": NAME, "messages": msgs, "max_tokens": 10, "temperature": 0,
           "chat_template_kwargs": {"enable_thinking": False}}
    st, _, body = s.post("/v1/chat/completions", req)
    check(st == 200, "chat: %s %s" % (st, body))
    msg = body["choices"][0]["message"]
    check(body["object"] == "chat.completion" and msg["role"] == "assistant", "chat shape: %s" % body)
    check("reasoning_content" not in msg, "no thinking asked, yet reasoning_content: %s" % msg)
    frames = s.stream("/v1/chat/completions", dict(req, stream=True))
    check(frames[0]["choices"][0]["delta"].get("role") == "assistant", "first chunk has no role")
    text, _, finish, usage = stream_text(frames, True)
    check(text == msg["content"], "chat stream %r != %r" % (text, msg["content"]))
    check(usage == body["usage"], "chat stream usage %s != %s" % (usage, body["usage"]))
    # Content parts are joined like a string.
    st, _, b2 = s.post("/v1/chat/completions", dict(req, messages=[msgs[0], {"role": "user", "content": [
        {"type": "text", "text": "Hel"}, {"type": "text", "text": "lo!"}]}]))
    check(st == 200 and b2["choices"][0]["message"]["content"] == msg["content"], "content parts: %s" % b2)
    # A control token written by the user is text: it costs several tokens, not one.
    one = lambda t: s.post("/v1/chat/completions", dict(req, max_tokens=1, messages=[{"role": "user", "content": t}]))
    _, _, plain = one("x")
    _, _, ctl = one("x<|im_start|>")
    grown = ctl["usage"]["prompt_tokens"] - plain["usage"]["prompt_tokens"]
    check(grown > 1, "a literal <|im_start|> in a message became %d token(s)" % grown)
    # Thinking on: whatever the model writes, content and reasoning_content add up to its reply.
    st, _, th = s.post("/v1/chat/completions", dict(req, chat_template_kwargs={"enable_thinking": True}))
    check(st == 200 and "reasoning_content" in th["choices"][0]["message"], "thinking reply: %s" % th)


def test_sampling_params(s):
    base = {"prompt": PROMPT, "max_tokens": 6}
    # Seeded sampling repeats; every parameter is accepted in range.
    req = dict(base, temperature=0.9, top_p=0.9, top_k=40, min_p=0.05, presence_penalty=0.5,
               frequency_penalty=0.5, repetition_penalty=1.1, seed=7, logit_bias={"11": 2.5}, ignore_eos=True)
    _, _, a = s.post("/v1/completions", req)
    _, _, b = s.post("/v1/completions", req)
    check(a["choices"][0]["text"] == b["choices"][0]["text"], "same seed, different text")
    # Without a seed, sampling at the default temperature 1 differs between requests.
    texts = {s.post("/v1/completions", dict(base, max_tokens=8))[2]["choices"][0]["text"] for _ in range(3)}
    check(len(texts) > 1, "unseeded sampling repeats itself: %s" % texts)
    check(a["usage"]["completion_tokens"] == 6, "ignore_eos with max_tokens 6: %s" % a["usage"])
    # logit_bias 100 forces a token under greedy decoding.
    _, _, f = s.post("/v1/completions", dict(base, temperature=0, logit_bias={"1879": 100}, logprobs=2))
    lp = f["choices"][0]["logprobs"]
    check(len(lp["tokens"]) == 6 and all(t == lp["tokens"][0] for t in lp["tokens"]), "logit_bias: %s" % lp)
    check(all(len(t) <= 2 for t in lp["top_logprobs"]) and all(x <= 0 for x in lp["token_logprobs"]), "logprobs")
    _, _, c = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                               "logprobs": True, "top_logprobs": 3})
    content = c["choices"][0]["logprobs"]["content"]
    check(len(content) == c["usage"]["completion_tokens"] and all(len(e["top_logprobs"]) == 3 for e in content),
          "chat logprobs: %s" % content)
    # max_completion_tokens is max_tokens' newer name.
    _, _, m = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                               "max_completion_tokens": 2, "ignore_eos": True})
    check(m["usage"]["completion_tokens"] == 2, "max_completion_tokens: %s" % m["usage"])


def test_stop_strings(s):
    _, _, full = s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True})
    text = full["choices"][0]["text"]
    check(len(text) >= 6, "too little text to pick a stop string from: %r" % text)
    stop = text[len(text) // 2: len(text) // 2 + 3]
    want = text[:text.find(stop)]
    req = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True, "stop": [stop, "\x00never"]}
    _, _, body = s.post("/v1/completions", req)
    check(body["choices"][0]["text"] == want and body["choices"][0]["finish_reason"] == "stop",
          "stop %r: got %r, want %r" % (stop, body["choices"][0]["text"], want))
    got, _, finish, _ = stream_text(s.stream("/v1/completions", dict(req, stream=True)), False)
    check(got == want and stop not in got and finish == "stop", "stream leaked the stop string %r: %r" % (stop, got))


def test_errors(s):
    P = "/v1/completions"
    C = "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    cases = [
        (P, b"{not json", 400, None),
        (P, b"[1, 2]", 400, None),
        (P, b'{"prompt": [1, 2]} trailing', 400, None),
        (P, {"prompt": 5}, 400, "prompt"),
        (P, {}, 400, "prompt"),
        (P, {"prompt": []}, 400, "prompt"),
        (P, {"prompt": ["a", "b"]}, 400, "prompt"),
        (P, {"prompt": [1, 999999999]}, 400, "prompt"),
        (P, {"prompt": [1, -3]}, 400, "prompt"),
        (P, {"prompt": [1.5]}, 400, "prompt"),
        (P, {"prompt": PROMPT, "max_tokens": -1}, 400, "max_tokens"),
        (P, {"prompt": PROMPT, "max_tokens": 1e300}, 400, "max_tokens"),
        (P, {"prompt": PROMPT, "max_tokens": "10"}, 400, "max_tokens"),
        (P, b'{"prompt": [1], "temperature": 1e999}', 400, "temperature"),
        (P, {"prompt": PROMPT, "temperature": -0.5}, 400, "temperature"),
        (P, {"prompt": PROMPT, "top_p": 0}, 400, "top_p"),
        (P, {"prompt": PROMPT, "top_p": 1.5}, 400, "top_p"),
        (P, {"prompt": PROMPT, "top_k": -2}, 400, "top_k"),
        (P, {"prompt": PROMPT, "min_p": 2}, 400, "min_p"),
        (P, {"prompt": PROMPT, "presence_penalty": 3}, 400, "presence_penalty"),
        (P, {"prompt": PROMPT, "frequency_penalty": -9}, 400, "frequency_penalty"),
        (P, {"prompt": PROMPT, "repetition_penalty": 0}, 400, "repetition_penalty"),
        (P, {"prompt": PROMPT, "seed": 0.5}, 400, "seed"),
        (P, {"prompt": PROMPT, "stop": 3}, 400, "stop"),
        (P, {"prompt": PROMPT, "stop": ["a"] * 9}, 400, "stop"),
        (P, {"prompt": PROMPT, "logit_bias": {"abc": 1}}, 400, "logit_bias"),
        (P, {"prompt": PROMPT, "logit_bias": {"999999999": 1}}, 400, "logit_bias"),
        (P, {"prompt": PROMPT, "logit_bias": {"5": 1000}}, 400, "logit_bias"),
        (P, {"prompt": PROMPT, "logprobs": 21}, 400, "logprobs"),
        (P, {"prompt": PROMPT, "n": 2}, 400, "n"),
        (P, {"prompt": PROMPT, "stream": "yes"}, 400, "stream"),
        (P, {"prompt": PROMPT, "model": "gpt-4"}, 400, "model"),
        (P, {"prompt": list(range(1, 201))}, 400, "prompt"),  # longer than --ctx 128
        (C, {"messages": []}, 400, "messages"),
        (C, {"messages": "hi"}, 400, "messages"),
        (C, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0]"),
        (C, {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0]"),
        (C, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400,
         "messages[0]"),
        (C, {"messages": msgs, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
        (C, {"messages": msgs, "tool_choice": "auto"}, 400, "tool_choice"),
        (C, {"messages": msgs, "top_logprobs": 2}, 400, "top_logprobs"),
        (C, {"messages": msgs, "response_format": {"type": "json_object"}}, 400, "response_format"),
        (C, {"messages": msgs, "chat_template_kwargs": {"enable_thinking": "no"}}, 400, None),
        ("/tokenize", {"prompt": 3}, 400, "prompt"),
        ("/detokenize", {"tokens": [1, 1 << 30]}, 400, "tokens"),
    ]
    for path, body, want, param in cases:
        st, _, data = s.request("POST", path, body)
        try:
            parsed = json.loads(data)
        except ValueError:
            fail("%s %r: body is not JSON: %r" % (path, body, data[:200]))
        e = check_error(st, parsed, want, "%s %r" % (path, body if isinstance(body, bytes) else str(body)[:80]),
                        param)
        if isinstance(body, dict) and isinstance(body.get("prompt"), list) and len(body["prompt"]) == 200:
            check("128" in e["message"] and "200" in e["message"], "context message lacks both numbers: %s" % e)
    # Authentication, sizes, routes.
    st, _, b = s.post(P, {"prompt": PROMPT}, headers={"Content-Type": "application/json"})
    check_error(st, b, 401, "no key")
    st, _, b = s.post(P, {"prompt": PROMPT}, headers={"Authorization": "Bearer " + KEY[:-1] + "X"})
    check_error(st, b, 401, "wrong key")
    st, _, b = s.post(P, {"prompt": PROMPT}, headers={"Authorization": "Bearer " + KEY + "X"})
    check_error(st, b, 401, "longer key")
    st, _, b = s.post(P, {"prompt": "x" * 70000})
    check_error(st, b, 413, "body over --max-body")
    st, _, b = s.post("/v1/nothing", {})
    check_error(st, b, 404, "unknown path")
    st, _, b = s.request("GET", P)
    check_error(st, json.loads(b), 405, "GET on a POST endpoint")
    # ... and the server still serves.
    st, _, body = s.post(P, {"prompt": PROMPT, "max_tokens": 2})
    check(st == 200 and body["usage"]["completion_tokens"] >= 1, "server does not serve after bad requests")


def test_concurrent(s, n=32, out=8):
    results = [None] * n

    def one(i):
        try:
            frames = s.stream("/v1/completions", {"prompt": PROMPT[: 1 + i % len(PROMPT)], "max_tokens": out,
                                                  "ignore_eos": True, "stream": True,
                                                  "stream_options": {"include_usage": True}}, timeout=300)
            results[i] = stream_text(frames, False)
        except BaseException as e:  # noqa: B902 - reported below
            results[i] = e

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.time()
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=300)
    for i, r in enumerate(results):
        check(isinstance(r, tuple), "stream %d failed: %r" % (i, r))
        _, _, finish, usage = r
        want = {"prompt_tokens": 1 + i % len(PROMPT), "completion_tokens": out,
                "total_tokens": 1 + i % len(PROMPT) + out}
        check(finish == "length" and usage == want, "stream %d: finish %s usage %s, want %s" % (i, finish, usage, want))
    print("concurrent: %d streams x %d tokens in %.1f s" % (n, out, time.time() - t0))


def wait_baseline(s, what, timeout=30):
    """No live HTTP request, no running or waiting request and no KV block in use
    (the engine publishes its gauges after finishing cancelled requests too, so no
    further request is needed to see what cancellations left behind)."""
    deadline = time.time() + timeout
    m = {}
    while time.time() < deadline:
        m = s.metrics()
        if (m.get("tokamak_requests_running") == 0 and m.get("tokamak_requests_waiting") == 0 and
                m.get("tokamak_kv_blocks_used") == 0 and m.get("tokamak_http_requests_in_flight") == 0):
            return m
        time.sleep(0.1)
    fail("%s: metrics did not return to baseline: %s" % (what, {k: v for k, v in m.items()
                                                               if "bucket" not in k}))


def test_disconnects(s, n=100):
    base = wait_baseline(s, "before disconnects")
    rng = random.Random(1)
    body = json.dumps({"prompt": PROMPT, "max_tokens": 100, "ignore_eos": True, "stream": True}).encode()
    chat = json.dumps({"messages": [{"role": "user", "content": "hi " * 40}], "max_tokens": 100,
                       "ignore_eos": True}).encode()
    t0 = time.time()
    for i in range(n):
        b = body if i % 3 else chat  # chat ones are not streamed: they hang up while waiting
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        req = (b"POST /v1/completions HTTP/1.1\r\n" if i % 3 else b"POST /v1/chat/completions HTTP/1.1\r\n")
        req += b"Host: x\r\nAuthorization: Bearer " + KEY.encode() + b"\r\nContent-Type: application/json\r\n"
        req += b"Content-Length: %d\r\n\r\n" % len(b) + b
        sock.sendall(req)
        mode = rng.randrange(3 if i % 3 else 2)  # a chat reply comes whole at the end: no mid-stream
        if mode == 1:
            time.sleep(rng.uniform(0, 0.05))  # during queueing or prefill
        elif mode == 2:
            want = rng.randrange(1, 1500)  # mid-stream
            got = 0
            sock.settimeout(10)
            while got < want:
                d = sock.recv(want - got)
                check(d, "stream %d closed early" % i)
                got += len(d)
        sock.close()
    m = wait_baseline(s, "after %d disconnects" % n)
    aborted = m['tokamak_requests_total{finish_reason="abort"}'] - base['tokamak_requests_total{finish_reason="abort"}']
    check(aborted >= n * 0.8, "only %d of %d hung-up requests were cancelled" % (aborted, n))
    print("disconnects: %d in %.1f s, %d cancelled" % (n, time.time() - t0, aborted))


def test_slow_reader(s):
    """A client that stops reading does not hold up the others: they finish while it sleeps."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", s.port))
    b = json.dumps({"prompt": PROMPT, "max_tokens": 60, "ignore_eos": True, "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                 b"\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
    done = []

    def other():
        f = s.stream("/v1/completions", {"prompt": PROMPT, "max_tokens": 20, "ignore_eos": True, "stream": True})
        done.append(stream_text(f, False)[3])

    ts = [threading.Thread(target=other) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=120)
    check(len(done) == 3, "other streams did not finish while one client was not reading")
    # The slow one then gets its whole stream.
    data = dechunk(read_all(sock, b""))
    check(data.endswith(b"data: [DONE]\n\n") and data.count(b'"finish_reason":"length"') == 1,
          "slow reader's stream is incomplete (%d bytes)" % len(data))


def frame_gaps(s, n):
    """Client-side gaps between the SSE frames of one n-token stream (seconds)."""
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
    try:
        c.request("POST", "/v1/completions", headers=s.headers(),
                  body=json.dumps({"prompt": PROMPT, "max_tokens": n, "ignore_eos": True, "stream": True}).encode())
        r = c.getresponse()
        check(r.status == 200, "gap stream status %s" % r.status)
        times = []
        while True:
            line = r.readline()
            if not line or line.startswith(b"data: [DONE]"):
                break
            if line.startswith(b"data: "):
                times.append(time.time())
    finally:
        c.close()
    return [b - a for a, b in zip(times, times[1:])]


def p90(x):
    x = sorted(x)
    return x[int(0.9 * (len(x) - 1))]


def test_cut_off():
    """A client that falls more than --max-pending bytes behind is cut off and its
    request cancelled, while another stream's inter-token gaps stay as they were."""
    # A small kernel send buffer (--sndbuf) so that the server's own buffer fills
    # after a few dozen frames, instead of after the ~4 MiB loopback autotunes to.
    s = Server("--max-pending", "16384", "--sndbuf", "16384", "--ctx", "2048", tag="cut_off")
    try:
        base_gaps = frame_gaps(s, 40)
        base = s.metrics()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", s.port))
        # 20 alternatives a token make every frame ~1 KB.
        b = json.dumps({"prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True, "stream": True,
                        "logprobs": 20}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                     b"\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
        gaps = frame_gaps(s, 40)  # while the slow client is not reading
        deadline = time.time() + 120
        abort = 'tokamak_requests_total{finish_reason="abort"}'
        while time.time() < deadline and s.metrics()[abort] == base[abort]:
            time.sleep(0.1)
        m = s.metrics()
        check(m[abort] == base[abort] + 1, "the client that stopped reading was not cut off")
        made = m["tokamak_generation_tokens_total"] - base["tokamak_generation_tokens_total"] - 40
        check(made < 2000, "the cut-off request ran to its end")
        wait_baseline(s, "after the cut-off")
        # Loose bound (a shared machine): the other stream's gaps did not grow with the slow client.
        check(p90(gaps) <= 3 * p90(base_gaps) + 0.05,
              "ITL p90 %.1f ms with a slow client, %.1f ms without" % (p90(gaps) * 1e3, p90(base_gaps) * 1e3))
        print("cut-off after %d tokens; ITL p90 %.1f ms alone, %.1f ms beside the client that stopped reading" %
              (made, p90(base_gaps) * 1e3, p90(gaps) * 1e3))
        sock.close()
    finally:
        s.stop()


def test_overload():
    s = Server("--max-queue", "2", "--max-batch", "1", tag="overload")
    res = []
    lock = threading.Lock()

    def one():
        st, h, body = s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 20, "ignore_eos": True})
        with lock:
            res.append((st, h, body))

    ts = [threading.Thread(target=one) for _ in range(10)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=300)
    check(len(res) == 10, "overload: requests hung")
    ok = [r for r in res if r[0] == 200]
    busy = [r for r in res if r[0] == 429]
    check(len(ok) + len(busy) == 10, "overload: statuses %s" % [r[0] for r in res])
    check(busy and ok, "overload: want both 200s and 429s, got %s" % [r[0] for r in res])
    for st, h, body in busy:
        check_error(st, body, 429, "queue full")
        check(int(h.get("Retry-After", "0")) >= 1, "429 without Retry-After: %s" % h)
    for st, h, body in ok:
        check(body["usage"]["completion_tokens"] == 20, "admitted request cut short: %s" % body["usage"])
    m = wait_baseline(s, "after overload")
    check(m['tokamak_requests_rejected_total{reason="queue_full"}'] == len(busy), "rejections not counted")
    check(s.stop() == 0, "overload server exit code")
    print("overload: %d admitted, %d refused with 429" % (len(ok), len(busy)))


def start_stream(s, max_tokens):
    """A streaming request on a raw socket; returns the socket once the first bytes arrived."""
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=60)
    b = json.dumps({"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                 b"\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
    first = sock.recv(65536)
    check(first.startswith(b"HTTP/1.1 200"), "stream start: %r" % first[:100])
    return sock, first


def read_all(sock, first, timeout=120):
    """Everything up to the end of the chunked body (or the connection)."""
    data = first
    sock.settimeout(timeout)
    while not data.endswith(b"\r\n0\r\n\r\n"):
        d = sock.recv(65536)
        if not d:
            break
        data += d
    sock.close()
    return data


def dechunk(raw):
    """The body of a chunked HTTP/1.1 response (headers included in raw)."""
    at = raw.index(b"\r\n\r\n") + 4
    body = b""
    while at < len(raw):
        nl = raw.index(b"\r\n", at)
        n = int(raw[at:nl], 16)
        if n == 0:
            break
        body += raw[nl + 2: nl + 2 + n]
        at = nl + 2 + n + 2
    return body


def test_drain():
    # long enough to be still running when the health check comes (a token is ~1 ms)
    s = Server("--drain-timeout", "60", "--ctx", "2048", tag="drain")
    sock, first = start_stream(s, 1500)
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    st, _, data = s.request("GET", "/health")
    check(st == 503 and b"draining" in data, "health while draining: %s %s" % (st, data))
    st, _, body = s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
    check_error(st, body, 503, "new request while draining")
    data = dechunk(read_all(sock, first))
    check(data.count(b'"finish_reason":"length"') == 1 and data.endswith(b"data: [DONE]\n\n"),
          "in-flight stream did not finish while draining")
    check(s.stop(sig=None, timeout=60) == 0, "drained server exit code")
    print("drain: in-flight stream finished, exit 0 after %.1f s" % (time.time() - t0))

    # Past --drain-timeout the rest is cancelled and the exit is still 0.
    s = Server("--drain-timeout", "0.5", tag="drain_timeout")
    sock, first = start_stream(s, 100000)
    t0 = time.time()
    rc = s.stop(timeout=30)
    check(rc == 0 and time.time() - t0 < 15, "drain timeout: exit %s after %.1f s" % (rc, time.time() - t0))
    data = read_all(sock, first, timeout=10)
    check(b"data: [DONE]" in data or len(data) > 0, "cancelled stream")

    # A second signal exits at once.
    s = Server("--drain-timeout", "600", tag="drain_twice")
    sock, first = start_stream(s, 100000)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    t0 = time.time()
    rc = s.stop(sig=signal.SIGTERM, timeout=10)
    check(rc == 128 + signal.SIGTERM and time.time() - t0 < 5, "second signal: exit %s" % rc)
    sock.close()


def main():
    t0 = time.time()
    s = Server("--max-body", "65536")
    try:
        for name, fn in [("basic", test_basic), ("chat", test_chat), ("sampling", test_sampling_params),
                         ("stop strings", test_stop_strings), ("errors", test_errors),
                         ("concurrent", test_concurrent), ("disconnects", test_disconnects),
                         ("slow reader", test_slow_reader)]:
            t = time.time()
            fn(s)
            print("%s: ok (%.1f s)" % (name, time.time() - t))
        m = s.metrics()
        for k in ("tokamak_time_to_first_token_seconds_count", "tokamak_inter_token_latency_seconds_count",
                  "tokamak_time_per_output_token_seconds_count", "tokamak_e2e_request_latency_seconds_count",
                  "tokamak_request_queue_time_seconds_count", "tokamak_generation_tokens_total",
                  "tokamak_prompt_tokens_total", "tokamak_kv_blocks_total", "tokamak_preemptions_total"):
            check(k in m, "metrics lack %s" % k)
        check(m["tokamak_time_to_first_token_seconds_count"] > 32, "TTFT histogram is not counting")
        check(m["tokamak_decode_steps_total"] > 0 and m["tokamak_decode_step_seconds_total"] > 0 and
              m["tokamak_decode_read_bytes_total"] > m["tokamak_decode_steps_total"],
              "pure decode steps are not counted: %s" % {k: v for k, v in m.items() if "decode_" in k})
        check(m['tokamak_time_to_first_token_seconds_bucket{le="+Inf"}'] ==
              m["tokamak_time_to_first_token_seconds_count"], "histogram +Inf bucket != count")
    finally:
        rc = s.stop()
    check(rc == 0, "server exit code %s" % rc)
    log = open(s.log_path).read()
    check(re.search(r"request cmpl-\w+ status 200 prompt 8 output 12 ttft [0-9.]+ s e2e [0-9.]+ s", log),
          "no per-request log line in: %s" % log[:600])
    test_cut_off()
    test_overload()
    test_drain()
    print("test_server: ok (%.1f s)" % (time.time() - t0))


main()
