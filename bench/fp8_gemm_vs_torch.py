#!/usr/bin/env python3
"""torch._scaled_mm on the FP8 operands laoyao_bench_fp8_gemm wrote (issue #39): the same FP8
values and scale_inv, the same fast-accumulation setting, compared element by element with
laoyao's output, and timed beside laoyao's time for the same GEMM (CUDA events, median of 20).

  build/.../laoyao_bench_fp8_gemm DIR && python3 bench/fp8_gemm_vs_torch.py DIR
"""
import glob
import json
import os
import sys

import numpy as np
import torch


def load(path, dtype, shape):
    return torch.from_numpy(np.fromfile(path, dtype=np.uint8).copy()).view(dtype).reshape(shape).cuda()


def median_ms(f, reps=20):
    for _ in range(3):
        f()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        f()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def main():
    folder = sys.argv[1]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("| case | max abs diff / max abs | elements differing | laoyao TFLOP/s | torch TFLOP/s | laoyao / torch |")
    print("|---|---|---|---|---|---|")
    for meta_path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        p = meta_path[:-5]
        m = json.load(open(meta_path))
        T, inner, out = m["T"], m["inner"], m["out"]
        a_type = torch.float8_e4m3fn if m["a"] == "e4m3" else torch.float8_e5m2
        a = load(p + ".a.bin", a_type, (T, inner))
        b = load(p + ".b.bin", torch.float8_e4m3fn, (out, inner))
        sa = load(p + ".a_scale_inv.bin", torch.float32, ())
        sb = load(p + ".b_scale_inv.bin", torch.float32, ())
        ours = load(p + ".out.bin", torch.bfloat16, (T, out)).float()
        run = lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                       use_fast_accum=m["fast_accum"])
        theirs = run().float()
        diff = (ours - theirs).abs()
        rel = float(diff.max() / theirs.abs().max())
        differing = int((diff > 0).sum())
        ms = median_ms(run)
        flops = 2.0 * T * inner * out
        print(f"| {os.path.basename(p)} | {rel:.2e} | {differing} of {diff.numel()} | {flops / m['ms'] / 1e9:.0f} | "
              f"{flops / ms / 1e9:.0f} | {ms / m['ms']:.2f} |")


if __name__ == "__main__":
    main()
