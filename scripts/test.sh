#!/usr/bin/env bash
# Runs Cube's whole test suite: unit tests and the integration tests against the real Docker
# engine (set up first when missing), then every benchmark once in a smoke form
# (scripts/bench-smoke.sh), so that a broken benchmark fails too, and the short chaos runs
# (scripts/chaos.sh): random kills under load, the history checked.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
else
  cargo test --workspace --no-fail-fast
fi
bash scripts/bench-smoke.sh
bash scripts/chaos.sh
