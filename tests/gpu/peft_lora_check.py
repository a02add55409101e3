#!/usr/bin/env python3
"""LoRA against peft itself, on the GPU machine (its Python has torch, transformers, peft and
safetensors). For a small random Llama and Qwen3 saved by transformers (fp32):

  1. `laoyao checkpoint import-hf` it; LoRA (peft.scheme lora, dim 8, alpha 16) trains 3 iterations
     from it on the GPU (Bridge's run-recipe of the import's model, as convert-args writes it),
     saving the adapters' checkpoint;
  2. `laoyao checkpoint export-hf CKPT --adapters` writes PEFT's files: peft's
     PeftModel.from_pretrained loads them onto the transformers model with every adapter weight
     matched, and its logits equal those of `export-hf CKPT` (the adapters merged into the base,
     loaded by transformers) within 1e-4, and differ from the base's (the adapters trained).

Usage (repository root; build/gpu-carry staged by scripts/gpu_check.sh stage):
  python3 tests/gpu/peft_lora_check.py build/gpu-carry/laoyao $OUT
Prints one line per check and a table last; exit status 1 when a check fails.
"""
import os
import shlex
import sys
import tempfile

import peft
import torch
import transformers
from check_common import Checks

LAOYAO = sys.argv[1] if len(sys.argv) > 1 else "build/gpu-carry/laoyao"
OUT = sys.argv[2] if len(sys.argv) > 2 else "/tmp/out"
VOCAB = 256
SEQ = 32

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
              rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False)
MODELS = {"LlamaForCausalLM": transformers.LlamaConfig(**COMMON), "Qwen3ForCausalLM": transformers.Qwen3Config(**COMMON)}

CHECKS = Checks(LAOYAO, OUT)
check, run = CHECKS.check, CHECKS.run


def main():
    torch.manual_seed(4321)
    for label, cfg in MODELS.items():
        work = tempfile.mkdtemp(prefix=f"peftcheck_{label}_")
        hf_dir, imported, ckpt, adapters, merged = (os.path.join(work, d)
                                                    for d in ("hf", "imported", "ckpt", "adapters", "merged"))
        model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32).eval()
        model.save_pretrained(hf_dir, safe_serialization=True)
        try:
            run(["checkpoint", "import-hf", hf_dir, imported], log=f"peft_{label}_import.txt")
            flags = open(os.path.join(imported, "model_flags.txt")).read().split()
            mlm = flags + ["--seq-length", str(SEQ), "--micro-batch-size", "2", "--global-batch-size", "2",
                           "--train-iters", "3", "--mock-data", "--tokenizer-type", "NullTokenizer",
                           "--vocab-size", str(VOCAB - 1), "--lr", "1e-2", "--min-lr", "1e-2", "--eval-iters", "0",
                           "--eval-interval", "1000", "--log-interval", "1", "--seed", "1234", "--bf16",
                           "--attention-dropout", "0", "--hidden-dropout", "0", "--save", ckpt,
                           "--save-interval", "3"]
            text = run(["convert-args", "--emit", "overrides"] + mlm)
            recipe = shlex.split(" ".join(line.rstrip("\\").strip() for line in text.splitlines()
                                          if line.strip() and not line.startswith("#")))
            lora = ["peft.scheme=lora", "peft.dim=8", "peft.alpha=16"]
            log = run(recipe[1:] + lora, device="cuda", log=f"peft_{label}_train.txt")
            check(f"{label}: LoRA trains on the GPU", "iteration        3/       3" in log,
                  [l for l in log.splitlines() if "iteration        3/" in l][-1][:160] if "iteration        3/" in log
                  else "no iteration 3")
            run(["checkpoint", "export-hf", ckpt, adapters, "--adapters", "--dtype", "fp32"], log=f"peft_{label}_adapters.txt")
            run(["checkpoint", "export-hf", ckpt, merged, "--dtype", "fp32"], log=f"peft_{label}_merged.txt")
            tokens = torch.randint(0, VOCAB - 1, (2, SEQ))
            with torch.no_grad():
                base_logits = model(input_ids=tokens).logits.float()
                loaded = peft.PeftModel.from_pretrained(model, adapters).eval()
                names = [n for n, _ in loaded.named_parameters() if "lora_" in n]
                peft_logits = loaded(input_ids=tokens).logits.float()
                merged_model = transformers.AutoModelForCausalLM.from_pretrained(merged).eval()
                merged_logits = merged_model(input_ids=tokens).logits.float()
            diff = float((peft_logits - merged_logits).abs().max())
            moved = float((peft_logits - base_logits).abs().max())
            check(f"{label}: peft loads the adapters", len(names) == 2 * 7 * cfg.num_hidden_layers,
                  f"{len(names)} lora tensors (want {2 * 7 * cfg.num_hidden_layers})")
            check(f"{label}: peft's logits are the merged export's", diff <= 1e-4 and moved > 1e-3,
                  f"max |peft - merged| {diff:.2e}, max |peft - base| {moved:.2e}")
        except Exception as e:  # noqa: BLE001 -- one architecture's failure must not hide the other's
            check(label, False, str(e)[-600:])
    return CHECKS.finish()


if __name__ == "__main__":
    sys.exit(main())
