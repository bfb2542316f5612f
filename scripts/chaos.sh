#!/usr/bin/env bash
# The chaos run in its short form: three minutes on one manager (redb) and three on three
# managers sharing a three-member etcd, each from a fixed seed, under a mixed workload while
# processes and containers are killed, nodes drained and disks filled at random; the history
# is then checked (see BENCHMARKS.md, "Chaos"). A violation fails, printing the seed, the
# operations and the log lines behind it; the processes' logs are kept. Called by scripts/test.sh; needs what
# scripts/setup.sh installs (Docker, etcd). A long run by hand:
#   target/release/cube-bench chaos --duration 30m [--store etcd [--shard-controllers [--projects 4]]]   (a random seed, printed)
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/test-binaries.sh
duration=${CUBE_CHAOS_DURATION:-3m}

# Docker 20.10's engine can deadlock in its network controller under this load (goroutines
# waiting on its network store's lock in `CreateEndpoint`; BENCHMARKS.md, "Chaos": not
# Cube's). `cube-bench chaos` exits 3 when the engine stops answering, which is no violation:
# the engine is then killed and started again, clean (`restart_engine`), and the same seed
# runs again, up to three more times (a clean-clone CI run of 2026-11-28 met the hang twice
# in a row on one seed). A hang on the last try, or any violation, fails.
restart_engine() {
  pkill -9 -x dockerd || true
  pkill -9 -f containerd-shim || true
  pkill -9 -x containerd || true
  # A process killed with -9 is gone only once it has exited: wait for that (at most 30 s).
  # A dockerd started while the old containerd still exits finds containerd's pid file naming
  # a live process, says "containerd is still running", waits for its socket and gives up
  # ("failed to start containerd": seen twice in CI on 2026-11-27).
  for _ in $(seq 300); do
    pgrep -x dockerd >/dev/null || pgrep -x containerd >/dev/null \
      || pgrep -f containerd-shim >/dev/null || break
    sleep 0.1
  done
  # The containers' own processes outlive their killed shims (reparented to init), and so do
  # their network namespaces, whose addresses the next engine hands to new containers: the
  # host then reaches an orphan instead of the new container (seen 2026-11-27: requests to
  # published ports reset or went unanswered). Every process left in Docker's cgroups
  # belongs to a container of the killed engine.
  for procs in /sys/fs/cgroup/*/docker/*/cgroup.procs /sys/fs/cgroup/system.slice/docker-*.scope/cgroup.procs; do
    [ -r "$procs" ] || continue
    while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done < "$procs"
  done
  # Their pid files and sockets, and the killed shims' task state (the next containerd
  # cleans each up before it answers; a few hundred ran past dockerd's start timeout).
  rm -f /var/run/docker.pid /var/run/docker/containerd/containerd.pid \
    /var/run/docker/containerd/containerd.sock /var/run/docker/containerd/containerd.sock.ttrpc \
    || true
  rm -rf /var/run/docker/containerd/daemon/io.containerd.runtime.v2.task/moby/* || true
  # Their network namespaces outlive them too: the killed engine bind-mounted each under
  # /var/run/docker/netns, and each keeps its veth on docker0 with the container's address,
  # which the next engine gives again (seen 2026-11-28: a published port answered one request
  # in two). Every one belongs to a container of the killed engine.
  for netns in /var/run/docker/netns/*; do
    [ -e "$netns" ] || continue
    umount "$netns" 2>/dev/null || true
    rm -f "$netns" || true
  done
  for veth in $(ip -o link show master docker0 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
    ip link del "$veth" 2>/dev/null || true
  done
  # The network store the deadlock sits on, with the endpoints of every container the killed
  # engine ran: the next engine makes it anew (the default bridge; nothing after the chaos
  # runs needs another network).
  rm -f /var/lib/docker/network/files/local-kv.db || true
  bash scripts/setup.sh >&2
  # What the killed runs' workers left (their containers, stopped by the new engine).
  local left
  left=$(docker ps -aq --filter name=cube-chaos- || true)
  if [ -n "$left" ]; then
    # shellcheck disable=SC2086
    docker rm -f $left >/dev/null 2>&1 || true
  fi
}

chaos() {
  local status
  for attempt in 1 2 3; do
    status=0
    "$bench" chaos "$@" || status=$?
    if [ "$status" -ne 3 ]; then
      return "$status"
    fi
    echo "chaos: the Docker engine hung (not a violation; attempt $attempt of 3); starting it again" >&2
    restart_engine
  done
  "$bench" chaos "$@"
}

chaos --store redb --seed 1 --duration "$duration"
chaos --store etcd --seed 3 --duration "$duration"
# Seeds that found a defect, kept as cases of their own: seed 2, one minute, let a newer
# waiting-list request into room an older one waited for (fixed 2026-11-27). Seed 12 on etcd,
# two minutes, left a pod's container running for a Completed task after its worker was
# killed mid-start (fixed 2026-11-27). Seed 1's first minute found a worker given more than it
# offers after a pause; the run above covers it. Seed 7779875253913012957 on etcd, in a
# 30-minute run at one fault a second, found at 148 s a newer waiting-list request given the
# room of a worker started again (fixed 2026-11-27): its first three minutes are kept. The
# other 30-minute seeds that found a defect are listed in BENCHMARKS.md ("Chaos"), for replays
# by hand; the fault loop has changed since, so a replay is the same seed, not the same run.
chaos --store redb --seed 2 --duration 60s
chaos --store etcd --seed 12 --duration 2m
chaos --store etcd --seed 7779875253913012957 --fault-every 1s --duration 3m
# The managers acting for their own shards (`--shard-controllers`, issue 32): a killed
# manager's projects move to the others while the workload goes on (seed 12 at a fault every
# 2 s killed 5 managers and 6 etcd members in its first two minutes, 0 violations).
chaos --store etcd --shard-controllers --seed 12 --fault-every 2s --duration 2m
# The same with the clients in 4 projects (shards 2, 5, 12 and 15 of the ring of 16), so
# that several managers own the workload and a kill moves some of it: 5 managers killed,
# 0 violations when added.
chaos --store etcd --shard-controllers --projects 4 --seed 12 --fault-every 2s --duration 2m
