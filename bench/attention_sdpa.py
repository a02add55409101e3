"""PyTorch's scaled_dot_product_attention (causal, bf16, its default backend choice) on the shapes of
bench/attention_bench.cpp, timed the same way (CUDA events, median of 20 after warm-up). The
grouped-query shapes (G < H, printed with G=) run with enable_gqa."""
import contextlib
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
for b, H, G, s, D in [(16, 16, 16, 1024, 128), (2, 16, 16, 8192, 128), (16, 32, 32, 1024, 64), (2, 32, 32, 8192, 64),
                      (2, 16, 4, 4096, 64), (1, 32, 8, 8192, 64), (8, 16, 4, 4096, 64), (8, 16, 16, 4096, 64),
                      (4, 16, 4, 4096, 64)]:
    q = torch.randn(b, H, s, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(b, G, s, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    gqa = dict(enable_gqa=True) if G != H else {}
    do = torch.randn(b, H, s, D, device="cuda", dtype=torch.bfloat16)
    def median(fn):
        for _ in range(3): fn()
        ts = []
        for _ in range(20):
            a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(e))
        return sorted(ts)[len(ts) // 2]
    fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
    def fwdbwd():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa); o.backward(do)
    flops = 4.0 * b * H * s * s * D / 2
    shape = f" G={G}" if G != H else ""
    # Its default choice, then its cuDNN backend alone (sdpa_cudnn; skipped where it refuses the shape).
    for name, backends in [("sdpa", None), ("sdpa_cudnn", [SDPBackend.CUDNN_ATTENTION])]:
        try:
            with sdpa_kernel(backends) if backends else contextlib.nullcontext():
                f, fb = median(fwd), median(fwdbwd)
        except RuntimeError as e:
            print(f"ATTN {name} b={b} H={H}{shape} s={s} D={D}: refused ({str(e).splitlines()[0][:80]})")
            continue
        print(f"ATTN {name} b={b} H={H}{shape} s={s} D={D} fwd_TFLOPs={flops / f / 1e9:.1f} "
              f"fwdbwd_TFLOPs={3.5 * flops / fb / 1e9:.1f}")
