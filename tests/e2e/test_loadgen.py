"""tokamak loadgen end to end against a real tokamak serve (see test_loadgen.sh)."""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

CLI, MODEL, DIR = sys.argv[1], sys.argv[2], sys.argv[3]
KEY = "lg-test-key"
NAME = "tiny"


def check(cond, msg):
    if not cond:
        print("FAIL: " + msg, file=sys.stderr)
        sys.exit(1)


def metrics(port):
    req = urllib.request.Request("http://127.0.0.1:%d/metrics" % port)
    text = urllib.request.urlopen(req, timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def start_server():
    log = open(os.path.join(DIR, "serve.log"), "w")
    p = subprocess.Popen([CLI, "serve", "-m", MODEL, "--port", "0", "--threads", "1", "--api-key", KEY,
                          "--served-model-name", NAME, "--max-batch", "8"],
                         stdout=log, stderr=subprocess.STDOUT)
    port = None
    t0 = time.time()
    while time.time() - t0 < 60:
        for line in open(os.path.join(DIR, "serve.log")):
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
        if port:
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=5) as r:
                    if r.status == 200:
                        return p, port
            except Exception:
                pass
        time.sleep(0.1)
    p.kill()
    check(False, "server did not come up")


def loadgen(tag, *args, want_rc=0):
    out = os.path.join(DIR, tag + ".md")
    err = os.path.join(DIR, tag + ".err")
    with open(out, "w") as fo, open(err, "w") as fe:
        rc = subprocess.call([CLI, "loadgen", *args], stdout=fo, stderr=fe, timeout=300)
    check(rc == want_rc, "loadgen %s exited %d, want %d: %s" % (tag, rc, want_rc, open(err).read()[-800:]))
    return open(out).read(), open(err).read()


def close(a, b, tol=1e-6):
    return abs(a - b) <= tol * max(1.0, abs(b))


def check_run(run, n_in, n_out, tag):
    reqs = run["requests"]
    check(len(reqs) > 0, tag + ": no requests")
    check(run["errors"] == [], tag + ": errors %s" % run["errors"])
    check(run["metrics"]["errors"] == 0, tag + ": errors metric")
    for q in reqs:
        check(q["n_prompt"] == n_in, tag + ": prompt of %d tokens, want %d" % (q["n_prompt"], n_in))
        check(q["n_output"] == n_out, tag + ": output of %d tokens, want %d" % (q["n_output"], n_out))
        check(q["finish"] == "length", tag + ": finish %s" % q["finish"])
        check(q["ttft_s"] > 0 and q["t_first_s"] >= q["t_submit_s"], tag + ": ttft")
        check(close(q["e2e_s"], q["t_last_s"] - q["t_submit_s"]), tag + ": e2e")
        check(close(q["tpot_s"] * (n_out - 1), q["t_last_s"] - q["t_first_s"]), tag + ": tpot x (n-1)")
        itl = q["itl_s"]
        check(1 <= len(itl) + 1 <= n_out, tag + ": %d gaps for %d tokens" % (len(itl), n_out))
        check(all(g >= 0 for g in itl), tag + ": negative gap")
    tp = sorted(q["tpot_s"] for q in reqs)
    check(close(run["tpot_s"]["max"], tp[-1]), tag + ": tpot max")
    out_tok = sum(q["n_output"] for q in reqs)
    check(close(run["metrics"]["output_tok_s"], out_tok / run["duration_s"], 1e-4), tag + ": output tok/s")


# ---- options refused before anything runs ---------------------------------------
for bad in (["--in", "16"], ["--url", "http://127.0.0.1:1", "--rate", "2", "--concurrency", "2"],
            ["--url", "http://127.0.0.1:1", "--duration", "2", "--requests", "4"],
            ["--url", "http://127.0.0.1:1", "--duration", "0"],
            ["--url", "http://127.0.0.1:1", "--concurrency", "0"],
            ["--url", "http://127.0.0.1:1", "--ablation"]):
    rc = subprocess.call([CLI, "loadgen", *bad], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    check(rc == 2, "loadgen %s exited %d, want 2" % (bad, rc))
_, err = loadgen("badurl", "--url", "ftp://127.0.0.1:1", want_rc=1)
check("not an http" in err, "ftp URL: " + err)
# Nothing listens on port 1: the set-up fails with the URL in the message.
_, err = loadgen("refused", "--url", "http://127.0.0.1:1", "--model", "x", "--requests", "1", want_rc=1)
check("127.0.0.1:1" in err, "unreachable server: " + err)

srv, port = start_server()
url = "http://127.0.0.1:%d" % port
try:
    base = metrics(port)
    # ---- closed loop: exact prompt lengths, usage counts, consistent figures -----
    md, _ = loadgen("closed", "--url", url + "/v1/", "--api-key", KEY, "--concurrency", "1,3", "--in", "24",
                    "--out", "6", "--requests", "6", "--warmup", "1", "-q", "--json", DIR + "/closed.json",
                    "--csv", DIR + "/closed.csv")
    r = json.load(open(DIR + "/closed.json"))
    check(r["tool"] == "tokamak loadgen" and r["server"]["model"] == NAME, "json header %s" % r.get("server"))
    check(r["server"]["url"] == url, "trailing /v1/ not dropped: " + r["server"]["url"])
    (s,) = r["series"]
    check([p["concurrency"] for p in s["points"]] == [1, 3], "levels")
    for p in s["points"]:
        (run,) = p["runs"]
        check_run(run, 24, 6, "closed c=%d" % p["concurrency"])
    check("| 1 |" in md and "| 3 |" in md and "tokamak loadgen" in md, "markdown table")
    check("errors" in open(DIR + "/closed.csv").readline(), "csv has no errors column")
    m = metrics(port)
    key = "tokamak_prompt_tokens_total"
    check(m[key] - base[key] == 13 * 24, "server counted %g prompt tokens, want %d" % (m[key] - base[key], 13 * 24))

    # ---- --plot (gnuplot) ----------------------------------------------------------
    if shutil.which("gnuplot"):
        loadgen("plot", "--url", url, "--api-key", KEY, "--concurrency", "1,2", "--in", "8", "--out", "4",
                "--requests", "2", "--warmup", "0", "-q", "--plot", DIR + "/lg.png")
        check(open(DIR + "/lg.png", "rb").read(4) == b"\x89PNG", "--plot wrote no PNG")

    # ---- the model file's tokenizer makes the same prompts as /tokenize -----------
    loadgen("localtok", "--url", url, "--api-key", KEY, "--tokenizer", MODEL, "--concurrency", "2", "--in", "24",
            "--out", "6", "--requests", "2", "--warmup", "0", "-q", "--json", DIR + "/tok.json")
    t = json.load(open(DIR + "/tok.json"))
    check("locally" in t["server"]["prompts"], t["server"]["prompts"])
    check_run(t["series"][0]["points"][0]["runs"][0], 24, 6, "local tokenizer")

    # ---- Poisson arrivals for a duration ----------------------------------------
    loadgen("rate", "--url", url, "--api-key", KEY, "--rate", "8", "--duration", "1.5", "--in", "8", "--out", "4",
            "--warmup", "0", "-q", "--json", DIR + "/rate.json")
    q = json.load(open(DIR + "/rate.json"))
    run = q["series"][0]["points"][0]["runs"][0]
    check(q["series"][0]["points"][0]["rate"] == 8, "rate point")
    check(3 <= len(run["requests"]) <= 40, "%d requests in 1.5 s at 8/s" % len(run["requests"]))
    check(max(x["t_submit_s"] for x in run["requests"]) < 1.6, "submitted past the duration")
    check_run(run, 8, 4, "rate")

    # ---- background streams: measured in the window, closed at the end -----------
    loadgen("bg", "--url", url, "--api-key", KEY, "--background", "2", "--bg-in", "8", "--bg-out", "4000",
            "--concurrency", "1", "--requests", "2", "--in", "16", "--out", "4", "--warmup", "0", "-q", "--json",
            DIR + "/bg.json")
    b = json.load(open(DIR + "/bg.json"))
    run = b["series"][0]["points"][0]["runs"][0]
    bg = run["background"]
    check(bg["n_streams"] == 2 and not bg["exhausted"], "background %s" % {k: bg[k] for k in ("n_streams", "exhausted")})
    check(all(st["finish"] == "cancelled" and st["n_window"] > 0 for st in bg["streams"]), "streams %s" % bg["streams"])
    check_run(run, 16, 4, "bg foreground")
    t0 = time.time()
    while time.time() - t0 < 30:
        m = metrics(port)
        if m["tokamak_requests_running"] == 0 and m["tokamak_requests_waiting"] == 0:
            break
        time.sleep(0.2)
    check(m["tokamak_requests_running"] == 0, "background streams still running after loadgen exited")

    # ---- failures by status: a wrong key is a 401 for every request -------------
    # (Prompts from the local tokenizer: the server's /tokenize would refuse the key first.)
    md, err = loadgen("unauth", "--url", url, "--model", NAME, "--api-key", "wrong", "--tokenizer", MODEL,
                      "--concurrency", "2",
                      "--requests", "3", "--in", "8", "--out", "4", "--warmup", "0", "--json", DIR + "/unauth.json",
                      want_rc=1)
    u = json.load(open(DIR + "/unauth.json"))
    run = u["series"][0]["points"][0]["runs"][0]
    check(run["errors"] and run["errors"][0]["status"] == "401" and run["errors"][0]["count"] == 3,
          "errors %s" % run["errors"])
    check(run["metrics"]["errors"] == 3 and all(x["finish"] == "error" for x in run["requests"]), "error requests")
    check("| 2 | 401 | 3 |" in md, "markdown errors table:\n" + md)
    check("3 of 3 requests failed" in err, err)
    # Without a key and a model name the set-up's GET /v1/models already fails.
    _, err = loadgen("nokey", "--url", url, "--requests", "1", want_rc=1)
    check("401" in err, err)
    print("loadgen: ok")
finally:
    srv.terminate()
    srv.wait(timeout=60)
