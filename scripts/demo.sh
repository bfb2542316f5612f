#!/usr/bin/env bash
# Cube's main job on this machine: builds cube, starts a worker in the background and runs
# the sample task on it (the book's chapter 9 task, with a locally built image), then shows it
# answering on http://localhost:7777/health. Run it again to start over.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

node=cube-demo
port=5556
data_dir="$PWD/cube-data/demo"
task_id=bb1d59ef-9fc1-4e4b-a44d-db571eeed203

echo "==> building cube (release)"
cargo build --release --quiet -p cube
cube="$PWD/target/release/cube"

echo "==> building the sample image"
"$cube" sample-image

# Start over: stop the previous demo worker and remove what it left behind.
if [ -f "$data_dir/worker.pid" ]; then
  kill "$(cat "$data_dir/worker.pid")" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$(cat "$data_dir/worker.pid")" 2>/dev/null || break; sleep 0.1; done
fi
leftovers=$(docker ps -aq --filter "label=cube.node=$node")
[ -z "$leftovers" ] || docker rm -f $leftovers >/dev/null
rm -rf "$data_dir"
mkdir -p "$data_dir"

echo "==> starting worker $node on port $port (log: $data_dir/worker.log)"
setsid nohup "$cube" worker -n "$node" -p "$port" -d persistent --data-dir "$data_dir" \
  >"$data_dir/worker.out" 2>"$data_dir/worker.log" </dev/null &
echo $! >"$data_dir/worker.pid"
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$port/tasks" >/dev/null && break
  kill -0 "$(cat "$data_dir/worker.pid")" 2>/dev/null || { cat "$data_dir/worker.log" >&2; exit 1; }
  sleep 0.1
done

echo "==> submitting examples/sample-task.json"
curl -sS -X POST "http://127.0.0.1:$port/tasks" --data-binary @examples/sample-task.json >/dev/null
state=
for _ in $(seq 1 300); do
  state=$(curl -sS "http://127.0.0.1:$port/tasks/$task_id" | sed -n 's/.*"State":"\([A-Za-z]*\)".*/\1/p')
  [ "$state" = Running ] || [ "$state" = Failed ] && break
  sleep 0.1
done
curl -sS "http://127.0.0.1:$port/tasks/$task_id"; echo
if [ "$state" != Running ]; then
  echo "the sample task is $state, not Running; see $data_dir/worker.log" >&2
  exit 1
fi
echo "==> the task answers: GET http://localhost:7777/health -> $(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:7777/health)"
cat <<TXT

The worker runs in the background (pid $(cat "$data_dir/worker.pid")). Try:
  curl -s localhost:$port/tasks          # the tasks, as JSON
  curl -s localhost:$port/stats          # the machine's metrics
  curl -s -X DELETE localhost:$port/tasks/$task_id   # stop the task
  kill $(cat "$data_dir/worker.pid")     # stop the worker (its containers keep running)
TXT
