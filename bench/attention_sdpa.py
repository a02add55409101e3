"""PyTorch's scaled_dot_product_attention (causal, bf16, its default backend choice) on the shapes of
bench/attention_bench.cpp, timed the same way (CUDA events, median of 20 after warm-up)."""
import torch, torch.nn.functional as F
for b, H, s, D in [(16, 16, 1024, 128), (2, 16, 8192, 128), (16, 32, 1024, 64), (2, 32, 8192, 64)]:
    q, k, v = (torch.randn(b, H, s, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(b, H, s, D, device="cuda", dtype=torch.bfloat16)
    def median(fn):
        for _ in range(3): fn()
        ts = []
        for _ in range(20):
            a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(e))
        return sorted(ts)[len(ts) // 2]
    fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    def fwdbwd():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True); o.backward(do)
    flops = 4.0 * b * H * s * s * D / 2
    f, fb = median(fwd), median(fwdbwd)
    print(f"ATTN sdpa b={b} H={H} s={s} D={D} fwd_TFLOPs={flops / f / 1e9:.1f} fwdbwd_TFLOPs={3.5 * flops / fb / 1e9:.1f}")
