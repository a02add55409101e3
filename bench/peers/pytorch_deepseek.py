"""The PyTorch DeepSeek-V2 peer: a DeepSeek-V2-Lite-style pre-training step in plain PyTorch, the layer math
of transformers' DeepseekV2 modules (bf16 autocast over fp32 weights, fused AdamW): multi-latent attention
without the query latent (q: heads x (128 + 64); kv_down: 512 latent + 64 shared RoPE key dims, its RMSNorm;
kv_up: heads x (128 + 128)) through SDPA with its unequal q/k and v head dims; the first layer a dense
SwiGLU MLP, then 64 routed experts (softmax over all, top-6, through torch._grouped_mm when present, else a
loop) and two shared experts' width; no aux loss. Optionally torch.compile'd. Prints tokens/s and
Megatron-formula TFLOP/s over the ACTIVE parameters (MLA's projections and its q.k of 192 and p.v of 128
dims). Usage (GPU machine): python3 pytorch_deepseek.py NAME [--compile] [--loop]"""
import sys, time, torch, torch.nn as nn, torch.nn.functional as F
CFG = {  # layers, hidden, heads, dense_ffn, kv_lora, nope, rope, v_dim, experts, topk, expert_ffn, shared_ffn, vocab, seq, mbs
    "deepseek_v2_lite_4l": (4, 2048, 16, 10944, 512, 128, 64, 128, 64, 6, 1408, 2816, 102400, 4096, 1),
    "deepseek_tiny": (2, 256, 4, 512, 64, 32, 16, 32, 8, 2, 128, 256, 4096, 512, 2),
}
name = sys.argv[1]; compile_ = "--compile" in sys.argv; loop = "--loop" in sys.argv or not hasattr(torch, "_grouped_mm")
L, H, NH, DFF, R, DN, DR, DV, E, K, FF, SFF, V, S, B = CFG[name]
DQ = DN + DR
def rms(x, w, eps=1e-6): return F.rms_norm(x, (x.shape[-1],), w, eps)
def rope(x, cos, sin):
    x1, x2 = x[..., : DR // 2], x[..., DR // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
def swiglu(x, w1, w2):
    a, g = (x @ w1.to(x.dtype)).chunk(2, -1)
    return (F.silu(a) * g) @ w2.to(x.dtype)
class Mlp(nn.Module):
    def __init__(s, ff):
        super().__init__()
        s.w1 = nn.Parameter(torch.randn(H, 2 * ff) * 0.02); s.w2 = nn.Parameter(torch.randn(ff, H) * 0.02)
    def forward(s, x): return swiglu(x, s.w1, s.w2)
class MoE(nn.Module):
    def __init__(s):
        super().__init__()
        s.router = nn.Parameter(torch.randn(E, H) * 0.02)
        s.w1 = nn.Parameter(torch.randn(E, H, 2 * FF) * 0.02); s.w2 = nn.Parameter(torch.randn(E, FF, H) * 0.02)
        s.shared = Mlp(SFF)
    def forward(s, x):
        probs, idx = (x @ s.router.to(x.dtype).t()).float().softmax(-1).topk(K, dim=-1)
        probs = probs.to(x.dtype)
        flat = idx.view(-1); order = flat.argsort(); tok = order // K
        xs = x[tok]
        if loop:
            counts = torch.bincount(flat, minlength=E).tolist(); outs, o = [], 0
            for e, c in enumerate(counts):
                outs.append(swiglu(xs[o:o + c], s.w1[e], s.w2[e])); o += c
            y = torch.cat(outs)
        else:
            offs = torch.bincount(flat, minlength=E).cumsum(0).to(torch.int32)
            h = torch._grouped_mm(xs.to(torch.bfloat16), s.w1.to(torch.bfloat16), offs=offs)
            a, g = h.chunk(2, -1)
            y = torch._grouped_mm((F.silu(a) * g).to(torch.bfloat16), s.w2.to(torch.bfloat16), offs=offs)
        y = y * probs.view(-1)[order].unsqueeze(-1)
        return torch.zeros_like(x).index_add_(0, tok, y.to(x.dtype)) + s.shared(x)
class Block(nn.Module):
    def __init__(s, moe):
        super().__init__()
        s.n1, s.n2, s.kvn = nn.Parameter(torch.ones(H)), nn.Parameter(torch.ones(H)), nn.Parameter(torch.ones(R))
        s.q = nn.Linear(H, NH * DQ, bias=False); s.kv_down = nn.Linear(H, R + DR, bias=False)
        s.kv_up = nn.Linear(R, NH * (DN + DV), bias=False); s.o = nn.Linear(NH * DV, H, bias=False)
        s.mlp = MoE() if moe else Mlp(DFF)
    def forward(s, x, cos, sin):
        b, t, _ = x.shape
        h = rms(x, s.n1)
        q = s.q(h).view(b, t, NH, DQ).transpose(1, 2)
        q_nope, q_pe = q.split([DN, DR], -1)
        latent, k_pe = s.kv_down(h).split([R, DR], -1)
        kv = s.kv_up(rms(latent, s.kvn)).view(b, t, NH, DN + DV).transpose(1, 2)
        k_nope, v = kv.split([DN, DV], -1)
        k_pe = rope(k_pe.view(b, 1, t, DR), cos, sin).expand(b, NH, t, DR)
        q = torch.cat([q_nope, rope(q_pe, cos, sin)], -1); k = torch.cat([k_nope, k_pe], -1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.o(y.transpose(1, 2).reshape(b, t, NH * DV))
        return x + s.mlp(rms(x, s.n2).view(b * t, H)).view(b, t, H)
class Model(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, H); s.blocks = nn.ModuleList([Block(l > 0) for l in range(L)])
        s.nf = nn.Parameter(torch.ones(H)); s.out = nn.Linear(H, V, bias=False)
        inv = 1.0 / (1e4 ** (torch.arange(0, DR, 2).float() / DR)); f = torch.outer(torch.arange(S).float(), inv)
        s.register_buffer("cos", f.cos(), persistent=False); s.register_buffer("sin", f.sin(), persistent=False)
    def forward(s, idx, tgt):
        x = s.emb(idx)
        for blk in s.blocks: x = blk(x, s.cos, s.sin)
        return F.cross_entropy(s.out(rms(x, s.nf)).float().view(-1, V), tgt.view(-1))
torch.manual_seed(0); m = Model().cuda()
total = sum(p.numel() for p in m.parameters())
active = total - (L - 1) * (E - K) * 3 * H * FF
opt = torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
fn = torch.compile(m) if compile_ else m
def step():
    idx = torch.randint(0, V, (B, S), device="cuda"); tgt = torch.randint(0, V, (B, S), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16): loss = fn(idx, tgt)
    loss.backward(); torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step(); opt.zero_grad(set_to_none=True); return loss
for _ in range(3): step()
torch.cuda.synchronize(); N = 10; t0 = time.perf_counter()
for _ in range(N): l = step()
torch.cuda.synchronize(); dt = (time.perf_counter() - t0) / N; tok = B * S
attn = H * NH * DQ + H * (R + DR) + R * NH * (DN + DV) + NH * DV * H  # MLA's projections
mlp = 3 * H * DFF + (L - 1) * (3 * H * (K * FF + SFF) + E * H)  # the dense layer's, then routed, shared, router
mm = L * attn + mlp + H * V
flops = 6 * mm * tok + 3 * L * S * NH * (DQ + DV) * tok  # causal q.k (192 dims) and p.v (128), x3 for backward
print(f"RESULT {name} compile={compile_} experts={'loop' if loop else 'grouped_mm'} total={total/1e9:.2f}B active={active/1e9:.2f}B step_ms={dt*1e3:.1f} tokens/s={tok/dt:,.0f} model_TFLOPs={flops/dt/1e12:.1f} mem_GB={torch.cuda.max_memory_allocated()/1e9:.1f} loss={l.item():.3f}")
