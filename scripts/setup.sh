#!/usr/bin/env bash
# Makes this machine ready for Cube: installs what is missing (Docker engine, busybox-static,
# curl, docker-compose, protobuf-compiler for the etcd client's build, gcc for ring's, etcd-server
# for the etcd store's tests, openssl for the tests' certificates, etcd-client for etcdctl,
# promtool for the metrics lint, chromium and chromium-driver for the web UI's tests,
# docker-registry and apache2-utils for the private-registry tests, haproxy for the router's
# HAProxy tests and wrk for its benchmark) from Debian's packages,
# and starts dockerd when no engine answers. Safe to run again.
set -euo pipefail

log() { printf 'setup: %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
installed busybox-static || missing+=(busybox-static)
command -v curl >/dev/null 2>&1 || missing+=(curl)
# The peer of `cube-bench pod`: a compose file's services started by docker-compose.
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
# The etcd client (cube-store) compiles etcd's protobuf files: it needs protoc to build.
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
# ring, the crypto under rustls (--tls), compiles C and assembly: it needs a C compiler.
command -v cc >/dev/null 2>&1 || missing+=(gcc)
# The tests start real etcd members on loopback ports (cube-test-support); the package starts
# no etcd of its own where there is no init system, and the tests never use its ports.
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
# The tests of certificates brought by the user (--tls-cert) make them as a user would, with
# openssl.
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
# The README's backup of an etcd store (`etcdctl snapshot save`).
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
# The web UI's tests drive the real page in headless Chromium through chromedriver.
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
# The private-registry tests start their own registries (Debian's docker-registry) with
# htpasswd basic auth on loopback ports (cube-test-support).
command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
# htpasswd makes those registries' bcrypt password files.
command -v htpasswd >/dev/null 2>&1 || missing+=(apache2-utils)
# `cube router --haproxy-config` keeps a real HAProxy's backends equal to the routes: its tests
# start their own HAProxy (Debian's) on loopback ports; the router's benchmark loads it, the
# router and a copy directly with the same tool, wrk.
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  # docker-registry also enables a registry service of its own (on port 5000, all interfaces),
  # started at once where an init system runs; where none runs (a container), invoke-rc.d finds
  # no runlevel and nothing starts. The tests never use it: it is stopped and disabled.
  if [[ " ${missing[*]} " == *" docker-registry "* ]]; then
    if [ -d /run/systemd/system ]; then
      as_root systemctl disable --now docker-registry.service >/dev/null 2>&1 || true
    else
      as_root update-rc.d docker-registry disable >/dev/null 2>&1 || true
      as_root /etc/init.d/docker-registry stop >/dev/null 2>&1 || true
    fi
  fi
  # So does haproxy (its packaged configuration listens on no port, but it is not ours).
  if [[ " ${missing[*]} " == *" haproxy "* ]]; then
    if [ -d /run/systemd/system ]; then
      as_root systemctl disable --now haproxy.service >/dev/null 2>&1 || true
    else
      as_root update-rc.d haproxy disable >/dev/null 2>&1 || true
      as_root /etc/init.d/haproxy stop >/dev/null 2>&1 || true
    fi
  fi
fi

# The metrics tests lint both processes' /metrics with Prometheus's own checker, `promtool
# check metrics`. Debian ships it only inside the `prometheus` package, whose installation
# would also add a Prometheus server (started at once where services may start, on port 9090)
# and ~100 MB of web assets: only the promtool binary is taken out of the package, so nothing
# starts and nothing else changes.
if ! command -v promtool >/dev/null 2>&1; then
  log "installing promtool (the binary alone, from Debian's prometheus package)"
  unpack=$(mktemp -d)
  # apt's download sandbox user must be able to write there.
  chmod 0755 "$unpack"
  if ! (cd "$unpack" && apt-get download -qq prometheus >/dev/null 2>&1); then
    as_root apt-get update -qq
    (cd "$unpack" && apt-get download -qq prometheus >/dev/null)
  fi
  dpkg-deb -x "$unpack"/prometheus_*.deb "$unpack/root"
  as_root install -m 0755 "$unpack/root/usr/bin/promtool" /usr/local/bin/promtool
  rm -rf "$unpack"
fi

if ! docker info >/dev/null 2>&1; then
  # A dockerd killed earlier leaves its pid file behind, and the next one refuses to start.
  # It may also linger as a zombie where PID 1 does not reap: only a live one counts.
  if ! ps -C dockerd -o stat= | grep -qv '^Z'; then
    as_root rm -f /var/run/docker.pid
    log "starting dockerd (log: /var/log/dockerd.log)"
    as_root sh -c 'nohup dockerd >/var/log/dockerd.log 2>&1 &'
  fi
  for _ in $(seq 1 120); do
    docker info >/dev/null 2>&1 && break
    sleep 0.5
  done
  if ! docker info >/dev/null 2>&1; then
    log "the Docker engine did not answer within 60 s; last lines of /var/log/dockerd.log:"
    tail -n 20 /var/log/dockerd.log >&2 || true
    exit 1
  fi
fi
log "Docker $(docker version --format '{{.Server.Version}} (API {{.Server.APIVersion}})') is ready"
