"""Sums Nsight Compute's per-kernel durations (ncu --csv --metrics gpu__time_duration.sum
--print-units base) into a table per step: by kind of kernel, then the kernels themselves.
Usage: python3 kernel_profile_summary.py PROFILE.csv STEPS (the profile holding STEPS steps' kernels)."""
import collections
import csv
import re
import sys

# Kinds, first match wins (cuBLAS/cuBLASLt's GEMMs are nvjet_*, sm90_xmma_*, cutlass*; cuDNN's
# attention cudnn_* (cudnn_generated_..._sm90_flash_..._wgmma included), fmha; PyTorch's SDPA flash
# kernels flash_*; Triton's fused kernels triton_*).
KINDS = [
    ("attention", r"cudnn|fmha|flash|attention"),  # before GEMM: cuDNN's kernels are named sm90_..._wgmma
    ("GEMM", r"nvjet|xmma|gemm|cutlass|wgmma_grouped|grouped_gemm|sm90_"),
    ("norm", r"norm"),
    ("cross entropy / softmax", r"cross_entropy|softmax|log_softmax|nll"),
    ("optimizer / grad norm", r"adam|multi_tensor|optimizer|grad_norm|l2norm|clip|foreach"),
    ("embedding", r"embedding|gather|index"),
    ("gelu / swiglu", r"gelu|swiglu|silu"),
    ("triton (fused)", r"triton"),
    ("copy / fill / reduce", r"copy|fill|memset|memcpy|reduce|sum|cast|elementwise|vectorized|unrolled"),
]


def kind(name):
    low = name.lower()
    for k, pat in KINDS:
        if re.search(pat, low):
            return k
    return "other"


def read(path):
    """(kernel name, grid, block) -> [count, total ns]."""
    out = collections.defaultdict(lambda: [0, 0.0])
    with open(path, newline="") as f:
        rows = [line for line in f if line.startswith('"')]
    for r in csv.DictReader(rows):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        if r.get("Metric Unit", "") in ("usecond", "us"):
            v *= 1e3
        elif r.get("Metric Unit", "") in ("msecond", "ms"):
            v *= 1e6
        key = (r["Kernel Name"], r.get("Grid Size", ""), r.get("Block Size", ""))
        out[key][0] += 1
        out[key][1] += v
    return out


def main():
    prof = read(sys.argv[1])
    steps = float(sys.argv[2])
    total = sum(t for _, t in prof.values())
    kernels = sum(n for n, _ in prof.values())
    print(f"kernels a step: {kernels / steps:.0f}, GPU time a step: {total / steps / 1e6:.3f} ms")
    by_kind = collections.defaultdict(float)
    for (name, _, _), (_, t) in prof.items():
        by_kind[kind(name)] += t
    print("| kind | ms a step | share |\n|---|---|---|")
    for k, t in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"| {k} | {t / steps / 1e6:.3f} | {100 * t / total:.1f}% |")
    print("\n| kernel (grid, block) | calls a step | ms a step | us a call |\n|---|---|---|---|")
    for (name, grid, block), (n, t) in sorted(prof.items(), key=lambda kv: -kv[1][1])[:45]:
        short = re.sub(r"\s+", " ", name)[:110]
        print(f"| {short} {grid} {block} | {n / steps:.1f} | {t / steps / 1e6:.3f} | {t / n / 1e3:.1f} |")


if __name__ == "__main__":
    main()
