# Sourced by scripts/bench-smoke.sh and scripts/chaos.sh: the debug binaries the test build
# makes (`target/debug/cube`, `target/debug/cube-bench`, each built for an integration test of
# its crate). After scripts/test.sh's test run this build is a no-op; a `cargo build -p cube
# -p cube-bench` instead would resolve the dev-dependencies' features another way and build
# every crate a second time, minutes in CI.
cargo test --workspace --no-run --quiet
bench=target/debug/cube-bench
