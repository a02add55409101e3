#!/usr/bin/env python3
"""import-hf / export-hf against transformers itself, on the GPU machine (its Python has torch,
transformers and safetensors). For each architecture laoyao maps, a small random model built and
saved by transformers (save_pretrained, safetensors, fp32):

  1. `laoyao checkpoint import-hf` it;
  2. laoyao's first training iteration's lm loss (the forward before any update) on the micro-batch
     `laoyao data-samples` says it reads, on the CPU (fp32: within 1e-4 relative) and on the GPU
     (bf16: within 2e-2 relative), against transformers' mean cross entropy on those tokens and
     labels, computed in fp32;
  3. `laoyao checkpoint export-hf --dtype fp32` the import: transformers' from_pretrained loads it with
     no missing or unexpected keys, and its logits equal the original model's (max |diff| <= 1e-5).

Usage (repository root; build/gpu-carry staged by scripts/gpu_check.sh stage):
  python3 tests/gpu/hf_transformers_check.py build/gpu-carry/laoyao $OUT
Prints one line per check and a table last; exit status 1 when a check fails.
"""
import json
import os
import sys
import tempfile

import torch
import transformers
from check_common import Checks

LAOYAO = sys.argv[1] if len(sys.argv) > 1 else "build/gpu-carry/laoyao"
OUT = sys.argv[2] if len(sys.argv) > 2 else "/tmp/out"
VOCAB = 256  # divisible by 128: laoyao's padded vocabulary is the checkpoint's
SEQ = 32

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
              rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False)
MODELS = {
    "GPT2LMHeadModel": transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                               activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                                               attn_pdrop=0.0),
    "LlamaForCausalLM": transformers.LlamaConfig(**COMMON),
    "LlamaForCausalLM (llama3 rope, tied)": transformers.LlamaConfig(
        **{**COMMON, "tie_word_embeddings": True,
           "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192}}),
    "Qwen2ForCausalLM": transformers.Qwen2Config(**COMMON),
    "Qwen3ForCausalLM": transformers.Qwen3Config(**COMMON),
    "Qwen3MoeForCausalLM": transformers.Qwen3MoeConfig(**COMMON, num_experts=4, num_experts_per_tok=2,
                                                       moe_intermediate_size=32, norm_topk_prob=True,
                                                       decoder_sparse_step=1, mlp_only_layers=[],
                                                       router_aux_loss_coef=0.0),
}
# DeepSeek: multi-latent attention (V2 without the q latent and with YaRN; V3 with it), the first
# layer dense, then routed and shared experts (V2's softmax router, V3's sigmoid with its expert bias
# and groups).
DEEPSEEK = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=4, max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0,
                tie_word_embeddings=False, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                first_k_dense_replace=1, routed_scaling_factor=2.5)
if hasattr(transformers, "DeepseekV2Config"):
    MODELS["DeepseekV2ForCausalLM"] = transformers.DeepseekV2Config(
        **DEEPSEEK, q_lora_rank=None, topk_method="greedy", norm_topk_prob=False,
        rope_scaling={"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 16, "beta_fast": 32.0,
                      "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707})
if hasattr(transformers, "DeepseekV3Config"):
    # (8 routed experts: with 4, the 4-element expert bias would leave the next RMSNorm weight off
    # the 16-byte alignment the GPU's norm kernels read; DeepSeek-V3's own 256 keep it.)
    MODELS["DeepseekV3ForCausalLM"] = transformers.DeepseekV3Config(
        **{**DEEPSEEK, "n_routed_experts": 8}, q_lora_rank=48, n_group=2, topk_group=1, norm_topk_prob=True,
        num_nextn_predict_layers=0)

CHECKS = Checks(LAOYAO, OUT)
check, run = CHECKS.check, CHECKS.run


def first_loss(log):
    for line in log.splitlines():
        if "iteration        1/" in line and "lm loss:" in line:
            return float(line.split("lm loss:")[1].split("|")[0])
    raise RuntimeError("no iteration 1 loss in the log")


def main():
    torch.manual_seed(1234)
    for label, cfg in MODELS.items():
        slug = label.split(" ")[0] + ("_" + label.split("(")[1].rstrip(")").replace(" ", "_").replace(",", "")
                                      if "(" in label else "")
        work = tempfile.mkdtemp(prefix=f"hfcheck_{slug}_")
        hf_dir, imported, exported = (os.path.join(work, d) for d in ("hf", "imported", "exported"))
        model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32).eval()
        with torch.no_grad():  # norms away from 1, so that a swapped weight shows
            for n, p in model.named_parameters():
                if "norm" in n or "ln_" in n:
                    p.add_(0.1 * torch.randn_like(p))
        model.save_pretrained(hf_dir, safe_serialization=True)
        try:
            run(["checkpoint", "import-hf", hf_dir, imported], log=f"{slug}_import.txt")
            flags = open(os.path.join(imported, "model_flags.txt")).read().split()
            train = flags + ["--seq-length", str(SEQ), "--micro-batch-size", "2", "--global-batch-size", "2",
                             "--train-iters", "1", "--mock-data", "--tokenizer-type", "NullTokenizer",
                             "--vocab-size", str(VOCAB - 1), "--lr", "1e-4", "--eval-iters", "0",
                             "--eval-interval", "1000", "--log-interval", "1", "--seed", "1234",
                             "--attention-dropout", "0", "--hidden-dropout", "0"]
            samples = [json.loads(x) for x in run(["data-samples", "--iterations", "1"] + train).splitlines()
                       if x.startswith("{")]
            batch = [s for s in samples if s.get("split") == "train"][0]
            tokens = torch.tensor(batch["tokens"]).view(-1, SEQ)
            labels = torch.tensor(batch["labels"]).view(-1, SEQ)
            mask = torch.tensor(batch["loss_mask"], dtype=torch.float32).view(-1, SEQ)
            with torch.no_grad():
                logits = model(input_ids=tokens).logits.float()
                ce = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), reduction="none")
                want = float((ce * mask.reshape(-1)).sum() / mask.sum())
            cpu = first_loss(run(["pretrain-gpt"] + train, device="cpu", log=f"{slug}_cpu.txt"))
            check(f"{label}: CPU loss", abs(cpu - want) <= 1e-4 * abs(want), f"laoyao {cpu:.6f}, transformers {want:.6f}")
            gpu = first_loss(run(["pretrain-gpt"] + train + ["--bf16"], device="cuda", log=f"{slug}_gpu.txt"))
            check(f"{label}: GPU loss (bf16)", abs(gpu - want) <= 2e-2 * abs(want),
                  f"laoyao {gpu:.6f}, transformers {want:.6f}")
            run(["checkpoint", "export-hf", imported, exported, "--dtype", "fp32"], log=f"{slug}_export.txt")
            back, info = transformers.AutoModelForCausalLM.from_pretrained(exported, output_loading_info=True)
            keys_ok = not info["missing_keys"] and not info["unexpected_keys"]
            with torch.no_grad():
                diff = float((back.eval()(input_ids=tokens).logits.float() - logits).abs().max())
            check(f"{label}: export loads", keys_ok and diff <= 1e-5,
                  f"missing {info['missing_keys']}, unexpected {info['unexpected_keys']}, max |logit diff| {diff:.2e}")
        except Exception as e:  # noqa: BLE001 -- one architecture's failure must not hide the others'
            check(f"{label}", False, str(e)[-600:])
    return CHECKS.finish()


if __name__ == "__main__":
    sys.exit(main())
