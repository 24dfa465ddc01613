#!/usr/bin/env python3
"""Two builds of the project side by side in one run: prefill and training
speed of build A against build B on the same model, rounds alternating
A, B, B, A, ... so that a machine's slow phases hit both (a refactor's
"no slower than before").

  bench/bench_builds.py BUILD_A BUILD_B [MODEL_DIR] [--prompt 256] [--windows 4]
      [--batch 4] [--ctx 128] [--steps 6] [--rounds 4] [--threads 2]

MODEL_DIR defaults to bench_engine.py's medium model (8 layers of 512, BF16,
made once under BUILD_B/models/medium). Prefill: `autocompress eval` of
--windows windows of --prompt tokens, one at a time (each a prefill;
tokens/s as eval reports it), on the model resident in its file dtype.
Training: bench/bench_train (forward + cross-entropy + backward, fp32) of
--batch x --ctx tokens, best of --steps steps. Prints each round, the best
and median of each build and the ratios B/A (above 1: B is quicker)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, HERE)


def prefill(build, model, text, a):
    out = subprocess.run([os.path.join(build, "autocompress"), "eval", model, text, "--ctx", str(a.prompt), "--windows",
                          str(a.windows), "--batch", "1", "--threads", str(a.threads), "--json"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["tok_per_s"]


def train(build, model, a):
    out = subprocess.run([os.path.join(build, "bench", "bench_train"), model, str(a.batch), str(a.ctx), str(a.steps),
                          str(a.threads)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["tok_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_a")
    ap.add_argument("build_b")
    ap.add_argument("model", nargs="?")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    builds = [os.path.abspath(a.build_a), os.path.abspath(a.build_b)]
    for b in builds:
        for exe in ("autocompress", os.path.join("bench", "bench_train")):
            if not os.access(os.path.join(b, exe), os.X_OK):
                sys.exit(f"bench_builds: {os.path.join(b, exe)} is missing (make all in that tree)")
    model = a.model
    if not model:
        os.environ["AC_BUILD"] = builds[1]
        from bench_engine import medium_model
        model = os.path.join(builds[1], "models", "medium")
        medium_model(model)
    # a text of enough tokens: the calibration text, repeated
    calib = os.path.join(ROOT, "build", "data", "calib.txt")
    if not os.path.exists(calib):
        calib = os.path.join(builds[1], "data", "calib.txt")
    body = open(calib).read() if os.path.exists(calib) else "the quick brown fox jumps over the lazy dog. " * 200
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(body * max(1, (a.prompt * a.windows * 8) // max(1, len(body)) + 1))
        text = f.name
    res = {0: {"prefill": [], "train": []}, 1: {"prefill": [], "train": []}}
    order = []
    for r in range(a.rounds):
        order += [0, 1] if r % 2 == 0 else [1, 0]
    try:
        for i in order:
            p = prefill(builds[i], model, text, a)
            t = train(builds[i], model, a)
            res[i]["prefill"].append(p)
            res[i]["train"].append(t)
            print(f"  {'AB'[i]}: prefill {p:8.1f} tok/s   train {t:8.1f} tok/s", flush=True)
    finally:
        os.unlink(text)
    print(f"A = {builds[0]}\nB = {builds[1]}\nmodel {model}; load average {os.getloadavg()[0]:.2f}")
    for what in ("prefill", "train"):
        ba, bb = max(res[0][what]), max(res[1][what])
        ma, mb = statistics.median(res[0][what]), statistics.median(res[1][what])
        print(f"{what:8s} best A {ba:8.1f}  B {bb:8.1f}  ratio B/A {bb / ba:.3f}   "
              f"median A {ma:8.1f}  B {mb:8.1f}  ratio B/A {mb / ma:.3f}")


if __name__ == "__main__":
    main()
