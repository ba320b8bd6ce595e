#!/usr/bin/env bash
# Builds the fuzz targets in fuzz/ with libFuzzer on the stable toolchain and runs each
# for a bounded time (issue 23).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# SECONDS_PER_TARGET defaults to 15 (the short run scripts/test.sh does); with no TARGET
# every target runs. A run starts from the committed seeds in fuzz/corpus/TARGET and keeps
# what it finds in fuzz/work/TARGET (not committed); a crash is written to
# fuzz/artifacts/TARGET/crash-<sha1> and fails the script. Replay one with
#   scripts/fuzz.sh replay TARGET fuzz/artifacts/TARGET/crash-<sha1>
#
# Instrumentation without nightly: rustc's stable `-C passes=sancov-module` and LLVM's
# sanitizer-coverage options give libFuzzer (compiled from C++ by the libfuzzer-sys crate)
# its edge counters and comparison hooks; no sanitizer runtime is linked, so memory
# errors show only as crashes (safe Rust has none to find). The flags apply to the target
# only (`--target`), never to build scripts and proc macros.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
triple=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}/fuzz"
export RUSTFLAGS="-Cpasses=sancov-module \
  -Cllvm-args=-sanitizer-coverage-level=4 \
  -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
  -Cllvm-args=-sanitizer-coverage-pc-table \
  -Cllvm-args=-sanitizer-coverage-trace-compares \
  --cfg fuzzing"
targets_all=(frames auth meta_request data_request replies chunk_store meta_store configs)
# Every input is at most this long (the largest message a peer may send is far longer,
# but the decoders' work and bounds show on short inputs), and every run holds at most
# this much memory: an allocation sized from a hostile length field fails the run.
max_len=4096
rss_limit_mb=512
malloc_limit_mb=64

build() {
  echo "== fuzz: building ${*:-every target} (libFuzzer, stable rustc, release)"
  local bins=()
  for t in "$@"; do bins+=(--bin "$t"); done
  # Not --locked: a dependency added to a workspace crate is added to fuzz/Cargo.lock
  # (commit it), instead of failing every test.sh run until someone does.
  (cd fuzz && cargo build --release --target "$triple" "${bins[@]}")
}

bin_of() { echo "$CARGO_TARGET_DIR/$triple/release/$1"; }

if [[ "${1:-}" == replay ]]; then
  target=$2
  shift 2
  build "$target"
  exec "$(bin_of "$target")" -rss_limit_mb=$rss_limit_mb -malloc_limit_mb=$malloc_limit_mb "$@"
fi

seconds=${1:-15}
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=("${targets_all[@]}")
build "${targets[@]}"
for t in "${targets[@]}"; do
  work="fuzz/work/$t"
  artifacts="fuzz/artifacts/$t"
  mkdir -p "$work" "$artifacts" "fuzz/corpus/$t"
  echo "== fuzz: $t for ${seconds}s"
  log="$work.log"
  if ! "$(bin_of "$t")" "$work" "fuzz/corpus/$t" -max_total_time="$seconds" \
      -max_len=$max_len -rss_limit_mb=$rss_limit_mb -malloc_limit_mb=$malloc_limit_mb \
      -timeout=10 -artifact_prefix="$artifacts/" -print_final_stats=1 >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "fuzz target $t failed; its input is in $artifacts/" >&2
    exit 1
  fi
  grep -E '^stat::number_of_executed_units|^stat::average_exec_per_sec|^stat::new_units_added' \
    "$log" | tr '\n' ' ' | sed "s/^/$t: /"
  echo
done
echo "== fuzz: every target ran ${seconds}s without a crash"
