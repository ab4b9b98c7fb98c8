#!/usr/bin/env bash
# Sets up everything FlopWatch's demo and tests need on a fresh Debian machine:
# the real servers from Debian's packages, then .venv with the package and its test extras.
# Idempotent: a second run installs nothing and takes about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian package -> a binary it installs. Tests start these servers for real.
declare -A DEB_BINARIES=(
  [prometheus]=prometheus
  [prometheus-alertmanager]=prometheus-alertmanager
  [victoria-metrics]=victoria-metrics
  [prometheus-node-exporter]=prometheus-node-exporter
  [chromium]=chromium            # report.pdf and the report's browser tests (about 30 s, 0.5 GB)
  # A real Slurm on loopback for `flopwatch remediate`'s tests (flopwatch/stack/slurm.py); the
  # packages' own services are not started in a container without an init system.
  [munge]=munged
  [slurmctld]=slurmctld
  [slurmd]=slurmd
  [slurm-client]=scontrol
)
missing=()
for pkg in "${!DEB_BINARIES[@]}"; do
  command -v "${DEB_BINARIES[$pkg]}" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install ${missing[*]}" >&2; exit 1; }
    SUDO=sudo
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$PY" -m venv .venv
fi
stamp=.venv/.flopwatch-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing flopwatch and its test extras into .venv" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
  echo "$want" > "$stamp"
fi
