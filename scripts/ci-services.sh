#!/usr/bin/env bash
# Services the test suite starts itself but needs installed. PostgreSQL: orchestrator store tests run
# on both SQLite and a throw-away Postgres cluster (tests/orchestrator/postgres_cluster.py).
set -euo pipefail
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends postgresql
fi
# nftables: NAT and cut links inside the network namespaces of the multi-host world (devnet/hosts.py).
if ! command -v nft >/dev/null 2>&1 && ! [ -x /usr/sbin/nft ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends nftables
fi
