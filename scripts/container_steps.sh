#!/usr/bin/env bash
# The container recipe's steps (Dockerfile), kept here so that CI runs them on its plain machine:
#   scripts/container_steps.sh build             install the build packages and build (scripts/setup.sh)
#   scripts/container_steps.sh bundle BUILD OUT  laoyao and the shared libraries it needs beyond
#                                                glibc, the C++ runtime and the CUDA libraries (which
#                                                the runtime image brings at their pinned versions)
#                                                into OUT and OUT/lib
#   scripts/container_steps.sh check OUT         the bundle's `laoyao doctor --no-gpu`: its CPU ops,
#                                                FP8 casts and the CUDA libraries it loads, checked
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  build) bash scripts/setup.sh default ;;
  bundle)
    B="$2" O="$3"
    rm -rf "$O" && mkdir -p "$O/lib"
    cp "$B/laoyao" "$O/"
    # What the loader resolves, less the base system's and the CUDA stack's.
    ldd "$B/laoyao" | awk '$3 ~ /^\// {print $3}' |
      grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*|libpthread|libdl|librt|libcuda|libcudart|libcublas[^/]*|libcudnn[^/]*|libnccl|libnvrtc[^/]*|libnvJitLink)\.so' |
      while read -r lib; do cp -L "$lib" "$O/lib/"; done
    ls "$O/lib" ;;
  check)
    O="$2"
    LD_LIBRARY_PATH="$PWD/$O/lib:${LD_LIBRARY_PATH:-}" "$O/laoyao" doctor --no-gpu ;;
  *) echo "usage: scripts/container_steps.sh build | bundle BUILD OUT | check OUT" >&2; exit 2 ;;
esac
