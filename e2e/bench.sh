#!/usr/bin/env bash
# `make bench`: every benchmark, one after another on this machine (never two at once: they
# would measure each other), release builds, then results/benchmarks.md assembled from what this
# run wrote, under a header naming the machine, the versions and the date.
#
# Parameters (environment; the defaults are the figures the issues ask for):
#   BENCH_ADMISSION="400 5 16 500"     admission_bench: creates per client, rounds, clients, record ms
#                                      (phases of 6,400 creates, about 5 s: shorter ones measure their start)
#   BENCH_SHARES="5 16 60 20"          shares_bench: rounds, clients, creates per client, transfers
#   BENCH_GROUP="--projects 100 --rounds 4 --creates 20"  group_bench flags
#   BENCH_STORM="--updates 200 --rounds 7"  update_storm flags
#   BENCH_CHAIN="--samples 100"        chain_latency flags
#   BENCH_PROPAGATION="120"            propagation: changes
#   BENCH_SEED_SCALE="--clusters 1000 --machines-per-cluster 100"
#   BENCH_MASTER_SCALE="--projects 10000 --seeds 3 --samples 50"
#   BENCH_OUT=results/benchmarks.md
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export KUBEBUILDER_ASSETS="${KUBEBUILDER_ASSETS:-$(e2e/control-plane/build.sh)}"
out=${BENCH_OUT:-results/benchmarks.md}
run_dir=$(mktemp -d)
trap 'rm -rf "$run_dir"' EXIT

# The components the benches start as processes, in release.
cargo build --release --locked --bins -p master-controller -p seed-controller -p machine-webhook >&2

started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
# Taken before the benches run: each rewrites its own results file in the tree.
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
sections=()
# run <title> <file the bench writes> <command...>: runs it, keeps a copy of what it wrote.
run() {
  local title=$1 file=$2
  shift 2
  echo "bench: $title: $*" >&2
  local t0=$SECONDS
  "$@" >&2
  cp "$file" "$run_dir/${#sections[@]}.md"
  sections+=("$title|$((SECONDS - t0))|$*")
}
# ex <crate> <example>: runs a release build of it (two crates have an example named `scale`,
# so each is built on its own).
ex() { echo "cargo run -q --release --locked -p $1 --example $2 --"; }

# shellcheck disable=SC2086 # the parameters are word lists on purpose
{
  run "Admission on one seed: far from the limit and tight" machine-webhook/results/admission.md \
    $(ex machine-webhook admission_bench) ${BENCH_ADMISSION:-400 5 16 500}
  run "Admission across seeds, tight, and share transfers" e2e/results/shares.md \
    $(ex e2e shares_bench) ${BENCH_SHARES:-5 16 60 20}
  run "Admission through a shared group of 100 projects" "$run_dir/groups.md" \
    $(ex e2e group_bench) ${BENCH_GROUP:---projects 100 --rounds 4 --creates 20} --out "$run_dir/groups.md"
  run "Update storm (matchConditions)" "$run_dir/storm.md" \
    $(ex seed-controller update_storm) ${BENCH_STORM:---updates 200 --rounds 7} --out "$run_dir/storm.md"
  run "Counting chain latency" "$run_dir/chain.md" \
    $(ex seed-controller chain_latency) ${BENCH_CHAIN:---samples 100} --out "$run_dir/chain.md"
  run "Master propagation" master-controller/results/propagation.md \
    $(ex master-controller propagation) ${BENCH_PROPAGATION:-120}
  run "seed-controller at scale" "$run_dir/seed-scale.md" \
    $(ex seed-controller scale) ${BENCH_SEED_SCALE:---clusters 1000 --machines-per-cluster 100} --out "$run_dir/seed-scale.md"
  run "master-controller at scale" "$run_dir/master-scale.md" \
    $(ex master-controller scale) ${BENCH_MASTER_SCALE:---projects 10000 --seeds 3 --samples 200} --out "$run_dir/master-scale.md"
}

mkdir -p "$(dirname "$out")"
{
  echo "# Benchmarks"
  echo
  echo "Written by \`make bench\` (e2e/bench.sh); every benchmark ran one after another in this run."
  echo
  echo "| | |"
  echo "| --- | --- |"
  echo "| started | $started |"
  echo "| finished | $(date -u +%Y-%m-%dT%H:%M:%SZ) |"
  echo "| commit | $commit |"
  echo "| cpu | $(nproc) x $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo) |"
  echo "| memory | $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo) |"
  echo "| kernel | $(uname -r) |"
  echo "| rustc | $(rustc --version) |"
  echo "| control plane | $(basename "$KUBEBUILDER_ASSETS") |"
  echo
  i=0
  for section in "${sections[@]}"; do
    IFS='|' read -r title seconds command <<<"$section"
    echo "## $title"
    echo
    echo "\`${command}\` ($seconds s of wall time, build included)"
    echo
    # Each bench's own file, its top-level heading dropped (this file has one).
    sed '1{/^# /d}' "$run_dir/$i.md" | sed 's/^#/##/'
    echo
    i=$((i + 1))
  done
} >"$out"
echo "bench: wrote $out" >&2
