#!/usr/bin/env bash
# Every Rust test in the workspace, all of them even when some fail. The whole output is kept in
# target/test-output.log; when a test fails, the run ends with a short summary of each failure
# (test binary, test, panic message), because a CI log is usually read from its tail, where cargo
# otherwise only names the failed binaries.
set -uo pipefail
cd "$(dirname "$0")/.."
log=target/test-output.log
mkdir -p target
"${CARGO:-cargo}" test --workspace --locked --no-fail-fast 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
  echo
  echo "==== failures (whole output: $log) ===="
  awk -f e2e/test-summary.awk "$log"
  # A full disk fails builds and tests in ways that name no test: say how much there was.
  df -h . | sed 's/^/disk: /'
fi
exit "$rc"
