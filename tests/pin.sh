#!/usr/bin/env bash
# Refreshes constraints.txt, the exact package set CI tests (tests/run.sh and the README's install use it):
# resolves pyproject.toml's own ranges afresh in a throwaway venv and writes what pip chose. Run the
# suite on the new pins before committing them: bash tests/pin.sh && bash tests/run.sh
# The pins hold for the Python that resolved them (CI's and the Dockerfile's: 3.11); PYTHON=... picks it.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m venv "$tmp/venv"
VPY="$tmp/venv/bin/python"
echo "== resolving .[test,docs,ansible] with $("$VPY" -c 'import sys; print(sys.version.split()[0])')"
"$VPY" -m pip install -q --disable-pip-version-check ".[test,docs,ansible]"
pyver=$("$VPY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
{
  echo "# What CI tests: pip install -c constraints.txt -e '.[test,docs,ansible]'. Written by: bash tests/pin.sh"
  echo "# python: $pyver"
  "$VPY" -m pip freeze --disable-pip-version-check --exclude edgeq | LC_ALL=C sort -f
} >"$tmp/constraints.txt"
mv "$tmp/constraints.txt" constraints.txt
echo "wrote constraints.txt ($(grep -vc '^#' constraints.txt) packages, python $pyver); now: bash tests/run.sh"
