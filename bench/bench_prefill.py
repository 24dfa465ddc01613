#!/usr/bin/env python3
"""Prefill speed and peak memory of the AutoCompress CPU engine against
llama.cpp on the same BF16 weights, side by side in one run (issue 16).

  bench/bench_prefill.py MODEL_DIR [--prompt 512] [--reps 3] [--rounds 3] [--threads 2] [--gguf PATH]

MODEL_DIR is a BF16 safetensors checkpoint (tools/make_shape_model.py makes
random-init ones with real shapes). Its GGUF comes from the project's own
exporter (`autocompress export-gguf`, BF16), written next to it unless
--gguf names one. llama.cpp runs through node-llama-cpp (tests/llama's npm
package; bench/prefill_llama.mjs) and evaluates --reps prompts of --prompt
tokens in one batch each; the engine runs `autocompress eval --ctx PROMPT
--windows REPS --batch 1` on a text of enough tokens (each window one prefill of
PROMPT tokens; it also computes the logits of every position, which
llama.cpp's prompt evaluation does only for the last: the engine does more
work). Both count their first prompt. --rounds alternate the two; prints
tokens/s of each (best round, and every round), the ratio engine/llama.cpp,
the peak RSS and the CPU seconds of each process (wait4; on a machine
shared with other work, llama.cpp's spinning thread pool loses far more to
oversubscription than the engine's blocking threads: read the load average
printed with the result)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD = os.path.abspath(os.environ.get("AC_BUILD", os.path.join(ROOT, "build")))
NODE_MODULES = os.path.join(ROOT, "tests", "llama", "node_modules")


def run(cmd, env=None):
    """Run cmd; its stdout, its peak RSS in MB and its CPU seconds (from wait4)."""
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        err = p.stderr.read().decode(errors="replace")
        p.stderr.close()
        out.seek(0)
        text = out.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"bench_prefill: {' '.join(cmd)} failed:\n{err[-2000:]}")
    return text, ru.ru_maxrss / 1024.0, ru.ru_utime + ru.ru_stime


def size_mb(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".safetensors")) / 2**20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gguf")
    ap.add_argument("--text", default=os.path.join(BUILD, "data", "train.txt"))
    a = ap.parse_args()
    a.model = os.path.abspath(a.model)
    if a.gguf:
        a.gguf = os.path.abspath(a.gguf)
    exe = os.path.join(BUILD, "autocompress")
    gguf = a.gguf or os.path.join(a.model, "model-bf16.gguf")
    if not os.path.exists(gguf):
        run([exe, "export-gguf", a.model, gguf])
    if not os.path.isdir(NODE_MODULES):
        sys.exit("bench_prefill: no tests/llama/node_modules (cp -r from a checkout that has it, or npm ci there)")
    # Rounds alternate llama.cpp and the engine, each alone on the machine; the
    # best round of each is compared (the machine is shared: the best is the
    # least disturbed), the medians are printed too.
    ll_tps, ac_tps, ll_rss, ac_rss, ll_cpu, ac_cpu = [], [], 0.0, 0.0, [], []
    for _ in range(a.rounds):
        text, rss, cpu = run(["node", os.path.join(HERE, "prefill_llama.mjs"), gguf, str(a.prompt), str(a.reps),
                              str(a.threads)])
        ll_cpu.append(cpu)
        ll_tps.append(json.loads(text.strip().splitlines()[-1])["tok_per_s"])
        ll_rss = max(ll_rss, rss)
        text, rss, cpu = run([exe, "eval", a.model, a.text, "--ctx", str(a.prompt), "--windows", str(a.reps),
                              "--batch", "1", "--threads", str(a.threads), "--json"])
        ac_cpu.append(cpu)
        ac_tps.append(json.loads(text.strip().splitlines()[-1])["tok_per_s"])
        ac_rss = max(ac_rss, rss)
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    res = {"model": os.path.basename(os.path.normpath(a.model)), "prompt": a.prompt, "reps": a.reps,
           "rounds": a.rounds, "threads": a.threads, "safetensors_mb": round(size_mb(a.model), 1),
           "gguf_mb": round(os.path.getsize(gguf) / 2**20, 1),
           "engine_tok_per_s": round(max(ac_tps), 1), "llama_tok_per_s": round(max(ll_tps), 1),
           "ratio": round(max(ac_tps) / max(ll_tps), 3), "ratio_median": round(med(ac_tps) / med(ll_tps), 3),
           "engine_rounds": [round(x, 1) for x in ac_tps], "llama_rounds": [round(x, 1) for x in ll_tps],
           "engine_peak_rss_mb": round(ac_rss, 1), "llama_peak_rss_mb": round(ll_rss, 1),
           "engine_cpu_s": [round(x, 1) for x in ac_cpu], "llama_cpu_s": [round(x, 1) for x in ll_cpu],
           "load_avg": os.getloadavg()[0]}
    print(f"prefill {a.prompt} tokens x {a.reps}, {a.threads} threads, {res['model']} "
          f"({res['safetensors_mb']:.0f} MB BF16):")
    print(f"  autocompress {res['engine_tok_per_s']:8.1f} tok/s  peak RSS {ac_rss:7.0f} MB  "
          f"CPU s per round (load included) {res['engine_cpu_s']}")
    print(f"  llama.cpp    {res['llama_tok_per_s']:8.1f} tok/s  peak RSS {ll_rss:7.0f} MB  "
          f"CPU s per round (load included) {res['llama_cpu_s']}")
    print(f"  ratio autocompress / llama.cpp = {res['ratio']:.2f} (best round of {a.rounds}; "
          f"medians {res['ratio_median']:.2f}); load average {res['load_avg']:.1f}")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
