#!/usr/bin/env bash
# The demo: start the daemon on loopback, measure this CPU's cost table,
# ask the daemon for the unpruned tiny fortunes model's predicted TPOT on it
# (POST /v1/estimate) and submit a compression job whose limit is 70% of
# that figure (AC_DEMO_FRACTION), so the job really prunes; stream its
# progress, print base / Minitron / AutoCompress, stop the daemon.
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
case "$B" in /*) ;; *) B="$PWD/$B" ;; esac # AC_BUILD may be absolute or relative
M="$B/models/tiny"
WL='{"batch": 1, "prompt_len": 128, "gen_len": 64}'
FRACTION=${AC_DEMO_FRACTION:-0.70}
# the tiny model is a BF16 checkpoint: the CPU engine runs it (and its BF16
# export) on its BF16 kernels, so its CPU target's table is the BF16 one
curl -sf -XPOST "http://127.0.0.1:$PORT/v1/cost-tables" -H 'Content-Type: application/json' -d '{"measure": {"device": "cpu", "dtype": "bf16"}}' >/dev/null
echo "measuring this CPU's BF16 cost table (POST /v1/cost-tables, 20-60 s) ..."
EST=""
for i in $(seq 300); do
  # a 400 until the table is cached; its message says why
  EST=$(curl -s -XPOST "http://127.0.0.1:$PORT/v1/estimate" -H 'Content-Type: application/json' \
        -d '{"model": "'"$M"'", "target": {"device": "cpu", "workload": '"$WL"'}}' || true)
  case "$EST" in *'"figures"'*) break ;; esac
  sleep 1
done
case "$EST" in *'"figures"'*) ;; *) echo "no estimate after 300 s; the last answer: $EST"; exit 1 ;; esac
LIMIT=$(echo "$EST" | /usr/bin/python3 -c "import json,sys; print('%.6g' % (json.load(sys.stdin)['figures']['tpot_ms'] * $FRACTION))")
echo "unpruned model's predicted TPOT on this CPU: $(echo "$EST" | /usr/bin/python3 -c "import json,sys; print('%.4f' % json.load(sys.stdin)['figures']['tpot_ms'])") ms; limit ${FRACTION} x = $LIMIT ms"
# the part of the predicted latency no structure moves (docs/costmodel.md): a CPU table's operator
# times are measured whole, call overhead included, so on the CPU it is 0 and every op scales with its shape
echo "fixed overhead share of that prediction: $(echo "$EST" | /usr/bin/python3 -c "import json,sys; print('%.2f' % json.load(sys.stdin)['figures']['overhead_share'])") (launches and per-call time; the rest is the model's own compute and bytes)"
# a multiple-choice task from the held-out fortunes (the first half of a
# fortune, its next four words against four words of three others; docs/tasks.md)
/usr/bin/python3 tools/make_fortune_task.py --text "$B/data/heldout.txt" --out "$B/data/fortunes-mc.jsonl" --n 200
cat > "$DIR/spec.json" <<JSON
{"name": "demo-tiny-cpu", "model": "$M", "calibration": "$B/data/calib.txt", "heldout": "$B/data/heldout.txt",
 "target": {"device": "cpu", "workload": $WL},
 "constraints": {"max_tpot_ms": $LIMIT}, "search": {"steps": 300, "seed": 0, "export_target": "gguf-deci"},
 "calibration_tokens": 8192,
 "eval": {"ctx": 128, "windows": 48, "tasks": [{"name": "fortunes", "path": "$B/data/fortunes-mc.jsonl"}]}}
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
m = r["measured_local"]
print()
print(f"target {r['target']['device_name']}, {r['target']['engine']['weights_dtype']} weights, workload "
      f"{r['target']['workload']}, constraints {r['constraints']}")
ft = r["baseline"].get("tasks", {}).get("fortunes")
if ft:
    print(f"acc: the fortune task's accuracy ({ft['n']} questions, 4 choices: chance 0.25, standard error about "
          f"{ft['stderr']:.3f}; tools/make_fortune_task.py, scored as lm-evaluation-harness does)")
print(f"held-out perplexity ({r['eval_protocol']['scored_tokens']} tokens); predicted figures on the target; "
      f"measured on this CPU (b{m['workload']['batch']} p{m['workload']['prompt_len']} g{m['workload']['gen_len']}, best of 3)")
print(f"{'':14} {'ppl':>8} {'acc':>6} {'limits':>7} {'pred tpot':>10} {'pred ttft':>10} {'params':>9} {'meas tpot':>10} {'meas ttft':>10}  architecture")
lims = r[r["chosen"]]["constraints"]
def met(k):  # every limit met (an arm's own verdicts; the base's from its predicted figures)
    if k != "baseline":
        return "met" if r[k]["feasible"] else "MISSED"
    p = r[k]["predicted"]
    return "met" if all((p[n] >= c["limit"]) if c["kind"] == "min" else (p[n] <= c["limit"]) for n, c in lims.items()) else "MISSED"
def arch(a):
    L = [l for l in a["layers"] if l["heads"] or l["ffn"]]
    s = {(l["heads"], l["kv_heads"], l["ffn"]) for l in L}
    if len(s) == 1:
        h, kv, f = s.pop()
        return f"{len(L)} layers x (heads {h}, kv {kv}, ffn {f}), hidden {a['hidden']}"
    return f"per layer (heads, kv, ffn) {[(l['heads'], l['kv_heads'], l['ffn']) for l in a['layers']]}, hidden {a['hidden']}"
for k in ("baseline", "minitron", "autocompress"):
    x = r[k]; p = x["predicted"]
    meas = m.get(k)
    mt = f"{meas['tpot_ms']:10.4f} {meas['ttft_ms']:10.3f}" if meas else f"{'-':>10} {'-':>10}"
    a = arch(x["architecture"]) if "architecture" in x else arch(r["model"]["architecture"])
    acc = x.get("tasks", {}).get("fortunes", {}).get("acc")
    acc = f"{acc:6.3f}" if acc is not None else f"{'-':>6}"
    print(f"{k + (' *' if k == r['chosen'] else ''):14} {x['perplexity']:8.2f} {acc} {met(k):>7} {p['tpot_ms']:10.4f} {p['ttft_ms']:10.3f} {p['params']:9.0f} {mt}  {a}")
pe, pb = m.get("prediction_error"), m.get("prediction_error_baseline")
if pe and pb:
    print(f"cost model vs this CPU at b{m['workload']['batch']} p{m['workload']['prompt_len']} "
          f"g{m['workload']['gen_len']} (measured_local.prediction_error): {r['chosen']} TTFT {pe['ttft']:+.1%}, "
          f"TPOT {pe['tpot']:+.1%}; baseline TTFT {pb['ttft']:+.1%}, TPOT {pb['tpot']:+.1%} "
          f"(load average {m.get('load_average', float('nan')):.2f})")
    q, sa, sb = m.get("quiet", {}), m.get("prediction_error_speed_adjusted"), m.get("prediction_error_baseline_speed_adjusted")
    if sa and sb:
        sr = q["speed_ratio"]
        print(f"  this CPU ran {sr['baseline']:.2f}x / {sr[r['chosen']]:.2f}x the table's reference probe time while "
              f"baseline / {r['chosen']} were timed ({q['remeasured_runs']} runs measured again, {q['disturbed_runs']} still disturbed); "
              f"with that drift taken out: {r['chosen']} TTFT {sa['ttft']:+.1%}, TPOT {sa['tpot']:+.1%}; "
              f"baseline TTFT {sb['ttft']:+.1%}, TPOT {sb['tpot']:+.1%}")
    for a in m.get("table_measured_again", []):
        print(f"  evaluate measured the CPU table again {a['when'].replace('_', ' ')} ({a['reason'].replace('_', ' ')}: "
              f"probe {a['reference_probe_us']:.1f} us against the table's {a['table_reference_probe_us']:.1f} us; "
              f"new table {a['new_table_reference_probe_us']:.1f} us)")
mt = r["minitron"]
if "candidates" in mt:
    by_task = isinstance(mt.get("score"), dict)  # spec minitron.score "task": candidates by task accuracy
    print(f"Minitron (Model-Optimizer's search): {mt['grid_size']} grid points, {mt['grid_feasible']} within the limit, "
          f"top {len(mt['candidates'])} scored "
          + (f"by {mt['score']['task']} {mt['score']['metric']}:" if by_task else "on calibration text (ppl):"),
          ", ".join(f"h{c['hidden_size']}/f{c['ffn_hidden_size']}/a{c['num_attention_heads']}/L{c['num_layers']}: "
                    + (f"{c.get('task_' + mt['score']['metric'], float('nan')):.3f}" if by_task
                       else f"{c.get('calib_ppl', float('nan')):.1f}")
                    for c in mt["candidates"]), f"; layers dropped: {mt['layers_dropped']}")
print(f"chosen (*): {r['chosen']} ({r.get('chosen_reason', 'job method ' + r['method'])}); exported to {r['export']['dir']} as {r['export']['format']}")
o = "minitron" if r["chosen"] == "autocompress" else "autocompress"
if o in r and r[o]["feasible"] and r[o]["perplexity"] < r[r["chosen"]]["perplexity"]:
    print(f"note: the {o} arm also met every limit with the lower perplexity ({r[o]['perplexity']:.2f} against "
          f"{r[r['chosen']]['perplexity']:.2f})")
PY
