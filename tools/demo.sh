#!/usr/bin/env bash
# The demo: start the daemon on loopback, submit a compression job for the
# tiny fortunes model (CPU target, TPOT limit at 75% of the unpruned model's),
# stream its progress, print the before/after table, stop the daemon.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${AC_BUILD:-build}
PORT=${AC_DEMO_PORT:-8321}
DIR=$(mktemp -d /tmp/autocompress-demo.XXXXXX)
"$B"/autocompressd --listen 127.0.0.1:$PORT --db "$DIR/jobs.db" --data-dir "$DIR/data" --web-dir "$PWD/web" 2>"$DIR/daemon.log" &
DPID=$!
trap 'kill $DPID 2>/dev/null; wait $DPID 2>/dev/null || true' EXIT
for i in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null && break; sleep 0.1; done
echo "daemon up: http://127.0.0.1:$PORT/ (dashboard), data in $DIR"
M="$PWD/$B/models/tiny"
cat > "$DIR/spec.json" <<JSON
{"name": "demo-tiny-cpu", "model": "$M", "calibration": "$PWD/$B/data/calib.txt", "heldout": "$PWD/$B/data/heldout.txt",
 "target": {"device": "cpu", "workload": {"batch": 1, "prompt_len": 128, "gen_len": 64}},
 "constraints": {"max_tpot_ms": 0.45}, "search": {"steps": 300, "seed": 0, "export_target": "gguf-deci"},
 "calibration_tokens": 8192, "eval": {"ctx": 128, "windows": 48}}
JSON
JOB=$(curl -sf -XPOST "http://127.0.0.1:$PORT/v1/jobs" -H 'Content-Type: application/json' --data @"$DIR/spec.json" | sed 's/.*"id":\([0-9]*\).*/\1/;q')
echo "submitted job $JOB; streaming events (curl -N .../v1/jobs/$JOB/events):"
curl -sN "http://127.0.0.1:$PORT/v1/jobs/$JOB/events" | while IFS= read -r line; do
  case "$line" in
    "event: "*) ev=${line#event: } ;;
    "data: "*) case "$ev" in
        stage|state|cost_table|error|infeasible) echo "  [$ev] ${line#data: }" | cut -c1-160 ;;
        search) echo "  [search] ${line#data: }" | cut -c1-120 ;;
      esac ;;
  esac
done
curl -sf "http://127.0.0.1:$PORT/v1/jobs/$JOB/result" > "$DIR/result.json" || { echo "job did not succeed:"; curl -s "http://127.0.0.1:$PORT/v1/jobs/$JOB"; exit 1; }
/usr/bin/python3 - "$DIR/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print()
print(f"target {r['target']['device_name']}, workload {r['target']['workload']}, constraints {r['constraints']}")
print(f"{'':14} {'ppl':>8} {'tpot_ms':>9} {'ttft_ms':>9} {'params':>10}")
for k in ("baseline", "minitron", "autocompress"):
    x = r[k]; p = x["predicted"]
    print(f"{k:14} {x['perplexity']:8.2f} {p['tpot_ms']:9.4f} {p['ttft_ms']:9.3f} {p['params']:10.0f}")
m = r["measured_local"]
print(f"measured on this CPU (b{m['workload']['batch']} p{m['workload']['prompt_len']} g{m['workload']['gen_len']}): "
      f"tpot {m['base']['tpot_ms']:.3f} -> {m['result']['tpot_ms']:.3f} ms, ttft {m['base']['ttft_ms']:.2f} -> {m['result']['ttft_ms']:.2f} ms")
print("per-layer result (kv_heads, ffn):", [(l["kv_heads"], l["ffn"]) for l in r[r["chosen"]]["architecture"]["layers"]],
      "hidden", r[r["chosen"]]["architecture"]["hidden"])
print("exported to", r["export"]["dir"], "as", r["export"]["format"])
PY
