#!/usr/bin/env bash
# Runs one fuzz target under AFL++ for a while, on one core at low priority, and prints its
# numbers (docs/security.md, "Fuzzing").
#
#   fuzz/scripts/run.sh TARGET SECONDS [EXECS]
#
# Stops after SECONDS of fuzzing or EXECS executions (default 10 million, the target of
# docs/security.md), whichever comes first. Output in $FUZZ_RUNS/TARGET (../target/fuzz-runs).
# Needs `cargo install cargo-afl` (which builds AFL++) and the targets built:
#   (cd fuzz && cargo afl build --release)
# A run resumes where the last one in OUT_DIR stopped (its queue is the corpus).
set -euo pipefail
cd "$(dirname "$0")/.."
target=$1 seconds=$2 execs=${3:-10000000}
out=${FUZZ_RUNS:-../target/fuzz-runs}/$target
bin=${CARGO_TARGET_DIR:-../target}/release/$target
export AFL_SKIP_CPUFREQ=1 AFL_NO_AFFINITY=1 AFL_NO_UI=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1
mkdir -p "$out"
input=corpus/$target
# Resume: AFL++ takes "-" as input to continue the queue of an earlier run.
[ -f "$out/default/fuzzer_stats" ] && input=-
# -m: 1 GiB of address space per input (a memory blow-up is a crash); -t: 2 s per input.
nice -n 19 cargo afl fuzz -i "$input" -o "$out" -m 1024 -t 2000 -V "$seconds" -E "$execs" "$bin" \
  > "$out.log" 2>&1 || true
grep -E '^(start_time|last_update|run_time|execs_done|execs_per_sec|corpus_count|bitmap_cvg|edges_found|total_edges|saved_crashes|saved_hangs|stability)' \
  "$out/default/fuzzer_stats"
