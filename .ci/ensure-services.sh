#!/usr/bin/env bash
# Make sure the system packages and the local PostgreSQL and Redis that the test suite uses are
# installed and running. Idempotent; run as root on a fresh machine (CI does).
# `ensure-services.sh sandbox`: only bubblewrap, the python verifiers' sandbox (for `make demo`).
set -euo pipefail

apt_install() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "Installing $* with apt-get..."
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    echo "missing $*: install it as root" >&2
  fi
}

command -v bwrap >/dev/null || apt_install bubblewrap || true
[ "${1:-}" = sandbox ] && exit 0  # `make demo` needs only the verifier sandbox
# the dashboard tests drive Debian's chromium with chromedriver (selenium)
{ command -v chromium && command -v chromedriver; } >/dev/null || apt_install chromium chromium-driver || true
# tests/deploy runs `docker-compose config` (no Docker engine needed)
command -v docker-compose >/dev/null || apt_install docker-compose || true

if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  command -v pg_ctlcluster >/dev/null || apt_install postgresql
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  for _ in $(seq 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
fi
pg_isready -h 127.0.0.1 -p 5432

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  command -v redis-server >/dev/null || apt_install redis-server
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 30); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 1; done
fi
redis-cli -h 127.0.0.1 -p 6379 ping
