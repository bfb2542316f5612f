#!/usr/bin/env bash
# Cube's main job on this machine: builds cube, starts a local cluster in the background
# (`cube dev`: a manager and a worker in one process) and runs the sample task on it (the
# book's chapter 9 task, with a locally built image) until `cube status` shows it Running and
# it answers on http://localhost:7777/health. Run it again to start over.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

node=cube-demo
manager=127.0.0.1:5555
data_dir="$PWD/cube-data/demo"
task_id=bb1d59ef-9fc1-4e4b-a44d-db571eeed203

echo "==> building cube (release)"
cargo build --release --quiet -p cube
cube="$PWD/target/release/cube"
export CUBE_MANAGER=$manager

echo "==> building the sample image"
"$cube" sample-image

# Start over: stop the previous demo cluster and remove what it left behind.
if [ -f "$data_dir/cube.pid" ]; then
  kill "$(cat "$data_dir/cube.pid")" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$(cat "$data_dir/cube.pid")" 2>/dev/null || break; sleep 0.1; done
fi
leftovers=$(docker ps -aq --filter "label=cube.node=$node")
[ -z "$leftovers" ] || docker rm -f $leftovers >/dev/null
rm -rf "$data_dir"
mkdir -p "$data_dir"

echo "==> starting a local cluster: cube dev -n $node (log: $data_dir/cube.log)"
setsid nohup "$cube" dev -n "$node" --data-dir "$data_dir" \
  >"$data_dir/cube.out" 2>"$data_dir/cube.log" </dev/null &
echo $! >"$data_dir/cube.pid"
for _ in $(seq 1 100); do
  curl -sf "http://$manager/nodes/$node" 2>/dev/null | grep -q '"Status":"Ready"' && break
  kill -0 "$(cat "$data_dir/cube.pid")" 2>/dev/null || { cat "$data_dir/cube.log" >&2; exit 1; }
  sleep 0.1
done
"$cube" node

echo "==> cube run -f examples/sample-task.json"
"$cube" run -f examples/sample-task.json
state=
for _ in $(seq 1 300); do
  state=$("$cube" status "$task_id" -o json | sed -n 's/^ *"State": "\([A-Za-z]*\)".*/\1/p')
  [ "$state" = Running ] || [ "$state" = Failed ] && break
  sleep 0.1
done
"$cube" status
if [ "$state" != Running ]; then
  echo "the sample task is $state, not Running; see $data_dir/cube.log" >&2
  exit 1
fi
# Running means Docker started the container; its server listens a moment later (up to 5 s).
answer=000
for _ in $(seq 1 50); do
  answer=$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:7777/health || true)
  [ "$answer" = 200 ] && break
  sleep 0.1
done
echo "==> the task answers: GET http://localhost:7777/health -> $answer"
cat <<TXT

The local cluster runs in the background (pid $(cat "$data_dir/cube.pid")). Try:
  http://localhost:5555/ui                # the web UI, in a browser
  target/release/cube status              # the tasks, like docker ps
  target/release/cube status bb1d         # one task, by a unique ID prefix
  target/release/cube node                # the workers and what they hold
  target/release/cube stop bb1d           # stop the task
  kill $(cat "$data_dir/cube.pid")                  # stop the cluster (containers keep running)
TXT
