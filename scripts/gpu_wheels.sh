#!/usr/bin/env bash
# Download, here, the wheels the GPU kit (scripts/gpu_kit.sh) needs that a bare GPU host lacks,
# into .whl/ (git-ignored): the lent H200 machine has Python 3.12, torch, triton, cupy,
# nvidia-cufile, cuda-pathfinder, numpy, xxhash and prometheus-client, but no network and no
# kvikio. Carry .whl/ with the run; gpu_kit.sh installs it into a temp dir.
#
#   kvikio-cu13 (Python API) -> libkvikio-cu13 (libkvikio.so) -> rapids-logger (its logger)
#   (msgspec is not needed: only the trace loaders use it, and the kit imports none of them)
#
# Usage: scripts/gpu_wheels.sh   (PYTHON=... picks the pip; prints each wheel and the total)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
WHEELS=(kvikio-cu13==26.10.0 libkvikio-cu13==26.10.0 rapids-logger==0.3.0)
LIMIT_MIB=60

mkdir -p .whl
rm -f .whl/*.whl  # one version of each: two of one name stop the install
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl "${WHEELS[@]}"

count=$(ls .whl/*.whl | wc -l)
if [ "$count" -ne "${#WHEELS[@]}" ]; then
  echo "error: .whl/ holds $count wheels, expected ${#WHEELS[@]} (${WHEELS[*]})" >&2; exit 1
fi
total=0
for w in .whl/*.whl; do
  size=$(stat -c %s "$w")
  total=$((total + size))
  printf '%8.2f MiB  %s\n' "$(echo "$size / 1048576" | bc -l)" "$(basename "$w")"
done
printf '%8.2f MiB  total in .whl/ (limit %d MiB)\n' "$(echo "$total / 1048576" | bc -l)" "$LIMIT_MIB"
if [ "$total" -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "error: .whl/ is over $LIMIT_MIB MiB: a device run carries at most 64 MiB with the tree" >&2; exit 1
fi
