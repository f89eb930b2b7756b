#!/usr/bin/env bash
# The test command (README, .ci/run): installs what the tests need, then runs lint, the documentation
# build and the suite.
# Needs root for apt (as in CI); elsewhere install openssh-server yourself first.
set -euo pipefail
cd "$(dirname "$0")/.."

# The quick-start test's board logs in as the README's user (nvidia) without a system account: sshd reads
# it from nss_wrapper's passwd file (tests/test_quickstart.py); its command runs unzip.
need=""
[ -e /usr/lib/x86_64-linux-gnu/libnss_wrapper.so ] || need="$need libnss-wrapper"
command -v unzip >/dev/null 2>&1 || need="$need unzip"
if [ -n "$need" ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "== installing$need (the quick-start test)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null
  else
    echo "warning:$need not installed and not root: the quick-start test will be skipped" >&2
  fi
fi

if ! command -v sshd >/dev/null 2>&1 && [ ! -x /usr/sbin/sshd ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "== installing openssh-server (transport and deploy tests run a real sshd on 127.0.0.1)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server openssh-client >/dev/null
  else
    echo "warning: sshd not found and not root: transport/deploy tests will be skipped" >&2
  fi
fi

# The interpreter itself, not a version-manager shim (pyenv's rehash hook can stall on a stale lock).
PY=$(python3 -c 'import sys; print(sys.executable)')

# The package set CI tests is pinned (constraints.txt, refreshed by tests/pin.sh) for the Python that
# resolved it; another Python resolves pyproject.toml's ranges itself, and says so.
pinned=$(sed -n 's/^# python: //p' constraints.txt)
have=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$pinned" = "$have" ]; then
  echo "== pip install -c constraints.txt -e .[test,docs,ansible]"
  "$PY" -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[test,docs,ansible]"
else
  echo "warning: constraints.txt pins Python $pinned's packages; this is $have: installing unpinned" >&2
  "$PY" -m pip install -q --disable-pip-version-check -e ".[test,docs,ansible]"
fi

echo "== ruff"
"$PY" -m ruff check edgeq tests bench

# The documentation site (mkdocs.yml, docs/): a broken link or anchor, or a page left out of the nav,
# fails here. Built into a temporary directory: the site is never committed.
echo "== mkdocs build --strict"
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
NO_MKDOCS_2_WARNING=1 "$PY" -m mkdocs build --strict --quiet --site-dir "$site"

echo "== pytest"
set +e
"$PY" -m pytest -q "$@"
rc=$?
set -e
# pytest exits 5 when it collected no tests: that is a failure for us, not a pass.
exit $rc
