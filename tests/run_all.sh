#!/usr/bin/env bash
# Runs every test program and script; prints one line per test and ends with
# "N passed, N failed, N skipped". Exit status 1 when anything failed.
set -u
cd "$(dirname "$0")/.."
export AC_TEST_ROOT="$PWD" AC_BUILD="${AC_BUILD:-$PWD/build}"
pass=0; fail=0; skip=0
# CPU: the CPU seconds (user + system) of this shell's finished children so
# far (bash's `times`, run in this shell: in a $(...) it would count the
# subshell's children only). Each test prints its wall and CPU seconds: a
# test with far fewer CPU- than wall-seconds mostly waits.
cpu_f=$(mktemp)
cpu_now() { times > "$cpu_f"; CPU=$(tail -1 "$cpu_f" | awk '{ t = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] } printf "%.2f", t }'); }
run() {
  local name="$1"; shift
  echo "== $name"
  local t0=$SECONDS c0; cpu_now; c0=$CPU
  local out; out=$("$@" 2>&1); local rc=$?
  cpu_now
  echo "   ($((SECONDS - t0)) s, $(awk -v a="$CPU" -v b="$c0" 'BEGIN { printf "%.0f", a - b }') CPU-s)"
  echo "$out" | grep -v '^RESULT ' | sed 's/^/   /'
  local res; res=$(echo "$out" | grep '^RESULT ' | tail -1)
  if [ -z "$res" ]; then echo "   (no RESULT line, exit $rc: counted as 1 failure)"; fail=$((fail+1)); return; fi
  set -- $res
  pass=$((pass+$2)); fail=$((fail+$3)); skip=$((skip+$4))
  if [ "$rc" != 0 ] && [ "$3" = 0 ]; then echo "   (exit $rc)"; fail=$((fail+1)); fi
}
# The CUDA backend's kernels and engine again, compiled for the CPU against
# tests/cuda_emu (real-GPU runs of test_cuda skip without a device).
emu_tests() {
  [ -f "$AC_BUILD/tests/libac_cuda_emu.so" ] || return 0
  run "test_cuda (kernels on the CPU emulator)" env AC_CUDA_PLUGIN="$AC_BUILD/tests/libac_cuda_emu.so" "$AC_BUILD/tests/test_cuda"
  run "test_block (each block op on the CUDA backend, CPU emulator)" env AC_CUDA_PLUGIN="$AC_BUILD/tests/libac_cuda_emu.so" "$AC_BUILD/tests/test_block"
  run "test_train (CUDA trainer on the CPU emulator)" env AC_TRAIN_CUDA_ONLY=1 AC_CUDA_PLUGIN="$AC_BUILD/tests/libac_cuda_emu.so" "$AC_BUILD/tests/test_train"
  run "test_dnas (gate search on the CUDA trainer, CPU emulator)" env AC_DNAS_CUDA_ONLY=1 AC_CUDA_PLUGIN="$AC_BUILD/tests/libac_cuda_emu.so" "$AC_BUILD/tests/test_dnas"
  run "test_dnas_moe (expert gates on the CUDA trainer, CPU emulator)" env AC_DNAS_CUDA_ONLY=1 AC_CUDA_PLUGIN="$AC_BUILD/tests/libac_cuda_emu.so" "$AC_BUILD/tests/test_dnas_moe"
  run "test_dnas_hybrid (a hybrid's gates on the CUDA trainer, CPU emulator)" env AC_DNAS_CUDA_ONLY=1 AC_CUDA_PLUGIN="$AC_BUILD/tests/libac_cuda_emu.so" "$AC_BUILD/tests/test_dnas_hybrid"
  run "test_cuda_job (MoE hybrid jobs on a CUDA target against the CPU's, CPU emulator)" env AC_CUDA_PLUGIN="$AC_BUILD/tests/libac_cuda_emu.so" "$AC_BUILD/tests/test_cuda_job"
}
# Three lanes, each on one thread (AC_TEST_THREADS=1 below: a lane, a
# core). The third runs test_slurm.py, then the dashboard's test: both
# mostly wait (on Slurm's scheduler and its node timeouts, on the browser)
# and use a few CPU-seconds. The second runs the emulator's tests,
# test_dnas_gain (gate searches), test_moe_cost_measured.py (it times on its
# thread's CPU clock and asserts no bound a neighbour moves: its bounds are
# a benchmark's), then LANE2_MORE_C and LANE2_MORE, whose last two measure
# CPU cost tables. The first lane runs the rest and, last, test_daemon.py,
# the third program that measures tables. The programs that measure tables
# (LATE) run last in their lanes and no longer beside a lane of two-thread
# work (that made them measure their tables again: a CPU of two threads
# runs at two speeds, one thread at one). The other lanes' output follows
# the first lane's. AC_TEST_SERIAL=1 runs everything in one lane, LATE last.
LANE2_C="test_dnas_gain"
LANE2="test_moe_cost_measured.py"
LANE2_MORE_C="test_gguf test_checkpoint test_resident_job test_puzzle"
LANE2_MORE="test_kd_budget.py test_moe.py test_deci_export.py"
LANE3="test_slurm.py"
LATE="test_daemon.py test_moe.py test_deci_export.py"
lane2_tests() {
  emu_tests
  for t in $LANE2_C $LANE2_MORE_C; do [ -x "$AC_BUILD/tests/$t" ] && run "$t (second lane)" "$AC_BUILD/tests/$t"; done
  for t in $LANE2 $LANE2_MORE; do [ -f "tests/$t" ] && run "$t (second lane)" /usr/bin/python3 "tests/$t"; done
}
# The dashboard in a headless browser: half a minute, mostly waiting on the
# browser (a few CPU-seconds), so in the third lane after test_slurm.py.
dashboard_test() {
  if [ -f tests/web/dashboard.test.mjs ] && [ -d tests/web/node_modules/playwright-core ] && command -v chromium >/dev/null; then
    run dashboard node tests/web/dashboard.test.mjs
  else
    echo "== dashboard (skipped: needs chromium and tests/web/node_modules; 'make web-test-deps')"; skip=$((skip+1))
  fi
}
lane3_tests() {
  for t in $LANE3; do [ -f "tests/$t" ] && run "$t (third lane)" /usr/bin/python3 "tests/$t"; done
  dashboard_test
}
lane_start() { # lane_start DIR FUNCTION: the function's tests in the background, output and counts into DIR
  (
    pass=0; fail=0; skip=0; cpu_f="$1/cpu"
    "$2"
    echo "$pass $fail $skip" > "$1/counts"
  ) > "$1/out" 2>&1 &
}
lane2_dir=""; lane3_dir=""
if [ "${AC_TEST_SERIAL:-0}" != 1 ]; then
  # a lane, a core: every engine, job and cost table of the tests on one
  # thread (tests/check.h, tests/harness.py), not two threads in each of two
  # lanes on two cores
  export AC_TEST_THREADS="${AC_TEST_THREADS:-1}"
  lane2_dir=$(mktemp -d); lane3_dir=$(mktemp -d)
  lane_start "$lane2_dir" lane2_tests; lane2_pid=$!
  lane_start "$lane3_dir" lane3_tests; lane3_pid=$!
fi
listed() { case " $1 " in *" $2 "*) return 0;; esac; return 1; } # listed LIST NAME
in_lane2() { [ -n "$lane2_dir" ] && listed "$LANE2 $LANE2_C $LANE2_MORE $LANE2_MORE_C $LANE3" "$1"; } # or the third
is_late() { listed "$LATE" "$1"; }
for t in "$AC_BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  in_lane2 "$(basename "$t")" && continue
  run "$(basename "$t")" "$t"
done
[ -z "$lane2_dir" ] && emu_tests
run fuzz_parsers bash -c '"$AC_BUILD"/tests/fuzz_parsers 30000 7 && echo "RESULT 1 0 0" || echo "RESULT 0 1 0"'
run "fuzz_parsers --extremes" bash -c '"$AC_BUILD"/tests/fuzz_parsers --extremes && echo "RESULT 1 0 0" || echo "RESULT 0 1 0"'
for t in tests/test_*.py; do
  [ -f "$t" ] || continue
  in_lane2 "$(basename "$t")" && continue
  is_late "$(basename "$t")" && continue
  run "$(basename "$t")" /usr/bin/python3 "$t"
done
for t in $LATE; do [ -f "tests/$t" ] && ! in_lane2 "$t" && run "$t" /usr/bin/python3 "tests/$t"; done
[ -z "$lane3_dir" ] && dashboard_test
lane_end() { # lane_end PID DIR NAME: its output and counts after the first lane's
  wait "$1"
  cat "$2/out"
  if read -r p2 f2 s2 < "$2/counts"; then
    pass=$((pass+p2)); fail=$((fail+f2)); skip=$((skip+s2))
  else
    echo "   ($3 lane: no counts: counted as 1 failure)"; fail=$((fail+1))
  fi
  rm -rf "$2"
}
if [ -n "$lane2_dir" ]; then
  lane_end "$lane2_pid" "$lane2_dir" second
  lane_end "$lane3_pid" "$lane3_dir" third
fi
cpu_now
echo "suite: $SECONDS s, ${CPU%.*} CPU-s (both lanes)"
rm -f "$cpu_f"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" = 0 ]
