#!/usr/bin/env bash
# Create .venv/ with stock SGLang 0.5.23 and sglang-saria (a plugin: nothing of SGLang is edited).
#   scripts/setup.sh          CPU install (CPU torch; SGLang without its CUDA-only packages) plus
#                             the CPU test rig (rig/: its own package and SGLang patches, CPU only)
#   scripts/setup.sh --gpu    full CUDA install for GPU hosts (+ kvikio for GDS); no rig
# Re-running reuses .venv/ and only re-installs when requirements/ changed.
set -euo pipefail

mode=cpu
case "${1:-}" in
  "") ;;
  --gpu) mode=gpu ;;
  *) echo "error: unknown option '$1' (use --gpu or nothing)" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
python=${PYTHON:-python3.11}
if ! command -v "$python" >/dev/null; then
  echo "error: $python not found; sglang 0.5.23 needs Python >= 3.11 (set PYTHON=...)" >&2
  exit 2
fi

[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)

stamp=.venv/.saria-setup-$mode
want=$(cat requirements/*.txt setup.py rig/pyproject.toml rig/saria_cpu_rig/patches/*/*.patch | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  start=$SECONDS
  echo "setup: installing the $mode environment into .venv/ (first run takes a few minutes)"
  # uv installs the same pinned set ~8x faster than pip (parallel downloads and unpacking);
  # it does not read pip's config, so pip's configured indexes and wheel folders are passed on.
  # --compile-bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set, a venv without .pyc
  # recompiles SGLang's sources in every server process (the test suite ran 2x slower).
  # Without uv (no registry access for it), pip does the same install.
  install=("${pip[@]}" install)
  reinstall=--force-reinstall
  if "${pip[@]}" install uv==0.13.9 >/dev/null 2>&1; then
    install=(.venv/bin/uv pip install -q --python .venv/bin/python --index-strategy unsafe-best-match --compile-bytecode)
    reinstall=--reinstall
    while read -r key value; do
      for v in $value; do
        case "$key" in
          *.find-links) install+=(--find-links "$v") ;;
          *.extra-index-url) install+=(--extra-index-url "$v") ;;
          *.index-url) install+=(--index-url "$v") ;;
        esac
      done
    done < <(.venv/bin/python -m pip config list 2>/dev/null | sed -E "s/^([^=]*)='?([^']*)'?$/\1 \2/")
  fi
  if [ "$mode" = cpu ]; then
    "${install[@]}" -c requirements/constraints-cpu.txt -r requirements/cpu.txt
    # --reinstall: a venv patched by an earlier setup gets SGLang's own files back first.
    "${install[@]}" --no-deps "$reinstall" sglang==0.5.23
  else
    "${install[@]}" -r requirements/gpu.txt
  fi
  "${pip[@]}" install --no-deps --no-build-isolation -e .
  if [ "$mode" = cpu ]; then
    "${pip[@]}" install --no-deps --no-build-isolation -e rig
  fi
  torch_version=$(.venv/bin/python -c 'import torch; print(torch.__version__)')
  if [ "$mode" = cpu ] && [ "$torch_version" != "2.13.0+cpu" ]; then
    echo "error: .venv has torch $torch_version, expected the CPU build 2.13.0+cpu" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
  echo "setup: installed in $((SECONDS - start)) s"
fi

if [ "$mode" = cpu ]; then
  .venv/bin/python -m saria_cpu_rig.apply_patches
fi
# HiCache's page-hash extension, compiled once here rather than in a server's first request
# (the launcher points servers at the same folder).
if [ ! -e .venv/torch_extensions/hicache_hash_cpp/hicache_hash_cpp.so ]; then
  TORCH_EXTENSIONS_DIR="$root/.venv/torch_extensions" .venv/bin/python -c \
    'from sglang.srt.mem_cache.cpp_utils.native_hash import _load_native_hash_module as m; m()'
fi
