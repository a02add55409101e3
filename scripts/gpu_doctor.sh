#!/usr/bin/env bash
# `laoyao doctor` on the GPU machine with a binary built here (shared/device.md).
#   scripts/gpu_doctor.sh stage [BUILD_DIR]   here: build laoyao, copy it and the shared libraries
#                                             the GPU machine lacks (yaml-cpp 0.7) to build/cuda-carry
#   scripts/gpu_doctor.sh run                 there (device tool, carry ["build/cuda-carry"]): run the
#                                             doctor with cuDNN and NCCL from PyTorch's venv; the
#                                             output also goes to $OUT/doctor.txt
set -euo pipefail
C=build/cuda-carry
case "${1:-}" in
  stage)
    B="${2:-build/helper-cuda}"
    [ -f "$B/build.ninja" ] || cmake --preset default -B "$B"
    cmake --build "$B" --target laoyao -j2
    mkdir -p "$C/lib"
    cp "$B/laoyao" "$C/"
    cp /lib/x86_64-linux-gnu/libyaml-cpp.so.0.7 "$C/lib/"
    # Gloo and what it pulls in (hiredis, ibverbs, libnl) are Debian's, absent on the GPU machine.
    for lib in $(ldd "$B/laoyao" | awk '/gloo|hiredis|ibverbs|libnl/ {print $3}'); do cp -L "$lib" "$C/lib/"; done
    ;;
  run)
    SP=$(python3 -c 'import site;print(site.getsitepackages()[0])')
    # The carried libraries last: where the machine has its own (libibverbs, say), its own win.
    export LD_LIBRARY_PATH="/usr/local/cuda/lib64:$SP/nvidia/cudnn/lib:$SP/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}:$PWD/$C/lib"
    export NCCL_NVLS_ENABLE=0  # never NVLink multicast on shared hosts (.library/device/KINDS.md)
    out="${OUT:-/tmp/out}"
    mkdir -p "$out"
    "$C/laoyao" doctor "${@:2}" 2>&1 | tee "$out/doctor.txt"
    ;;
  *)
    echo "usage: $0 stage [BUILD_DIR] | run [doctor options]" >&2
    exit 2
    ;;
esac
