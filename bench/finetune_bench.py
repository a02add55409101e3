#!/usr/bin/env python3
"""Fine-tuning at real size on one GPU: laoyao's `llama32_1b_sft_config` (full SFT) and
`llama3_8b_peft_config` (LoRA) beside a transformers + PEFT peer training the same rows.

For each case, on the GPU machine (its Python has torch, transformers, peft, safetensors):
  1. a random Llama 3.2 1B / Llama 3 8B written by transformers (bf16 safetensors) with the real
     Llama 3 tokenizer beside it, and SFT rows {"input", "output"} of random words
     (training.jsonl, validation.jsonl; seeded);
  2. laoyao runs the recipe as named, only paths given (checkpoint.pretrained_checkpoint,
     tokenizer.tokenizer_model, dataset.dataset_root) plus the iterations, no evaluation or save:
     packed (the recipes' default; attention within each example through cuDNN's attention over
     documents, and again through our flash kernels, model.attention_backend=flash) and, for the 1B,
     unpacked (each example its own row of the same length: the packed step's speed against the
     unpacked step's with the same tokens a row);
  3. `laoyao data-samples` prints the rows laoyao trained on (tokens, labels, loss mask, positions);
     the peer (transformers' Llama with SDPA attention, packed rows kept apart by the restarting
     position ids, as transformers does; PEFT's LoRA with the recipe's dim, alpha and targets for the
     8B; bf16 autocast; fused AdamW at laoyao's logged learning rate each iteration; full SFT keeps
     fp32 weights as Bridge's bf16_mixed) trains on the same micro-batches, the loss a micro-batch's
     mean over its loss tokens, as laoyao's.
Tokens/s of each run counts every position of a row (packs are padded to the sequence length),
the same for both; the table also prints the loss at the first and last iteration both ran.

Usage (repository root, build/ft-carry staged by `bash bench/finetune_bench.sh stage`):
  python3 bench/finetune_bench.py build/ft-carry/laoyao $OUT [llama32_1b_sft] [llama3_8b_peft]
Knobs (environment): ITERS (laoyao's iterations, 50; ITERS_AUX those of the unpacked and
flash-attention runs, 20), PEER_ITERS (the peer's, 20 for 1B, 12 for 8B),
PEER_COMPILE (1: torch.compile the peer's model; default 1 for the 1B, 0 for the 8B).
"""
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
import transformers

LAOYAO = sys.argv[1] if len(sys.argv) > 1 else "build/ft-carry/laoyao"
OUT = sys.argv[2] if len(sys.argv) > 2 else "/tmp/out"
CASES = sys.argv[3:] or ["llama32_1b_sft", "llama3_8b_peft"]
VOCAB_DIR = os.path.join(os.path.dirname(os.path.abspath(LAOYAO)), "llama3")
WORK = os.environ.get("FT_WORK", "/tmp/ftbench")
ITERS = int(os.environ.get("ITERS", "50"))
ITERS_AUX = int(os.environ.get("ITERS_AUX", "20"))  # the unpacked and flash-attention runs (timing only)

LLAMA = dict(vocab_size=128256, num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5,
             rope_theta=500000.0, bos_token_id=128000, eos_token_id=128001, hidden_act="silu")
MODELS = {
    "llama32_1b_sft": dict(recipe="llama32_1b_sft_config", peer_iters=20, compile=1, lora=False,
                           config=dict(LLAMA, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                       max_position_embeddings=131072, tie_word_embeddings=True,
                                       rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                                         high_freq_factor=4.0,
                                                         original_max_position_embeddings=8192))),
    "llama3_8b_peft": dict(recipe="llama3_8b_peft_config", peer_iters=12, compile=0, lora=True,
                           config=dict(LLAMA, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                       max_position_embeddings=8192, tie_word_embeddings=False)),
}
RESULTS = []
CURVES = []  # (case, {iteration: lm loss}) of each case's packed run, printed after the table


def log(msg):
    print(msg, flush=True)


def write_model(name, spec):
    folder = os.path.join(WORK, name + "_hf")
    if os.path.exists(os.path.join(folder, "config.json")):
        return folder
    torch.manual_seed(1234)
    cfg = transformers.LlamaConfig(**spec["config"])
    t0 = time.time()
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(VOCAB_DIR, f), folder)
    del model
    torch.cuda.empty_cache()
    log(f"{name}: random model written to {folder} in {time.time() - t0:.0f} s")
    return folder


def write_rows(n_train=8000, n_valid=64):
    folder = os.path.join(WORK, "rows")
    if os.path.exists(os.path.join(folder, "training.jsonl")):
        return folder
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(7)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(5000)]

    def text(lo, hi):
        return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))

    for split, n in (("training", n_train), ("validation", n_valid)):
        with open(os.path.join(folder, split + ".jsonl"), "w") as f:
            for _ in range(n):
                f.write(json.dumps({"input": "Context: " + text(20, 150) + " Question: " + text(4, 15) + "? Answer:",
                                    "output": text(3, 40)}) + "\n")
    return folder


def laoyao(args, logname, env=None):
    path = os.path.join(OUT, logname)
    t0 = time.time()
    with open(path, "w") as f:
        f.write("$ " + " ".join([f"{k}={v}" for k, v in (env or {}).items()] + [LAOYAO] + args) + "\n")
        f.flush()
        rc = subprocess.run([LAOYAO] + args, stdout=f, stderr=subprocess.STDOUT,
                            env=dict(os.environ, **(env or {}))).returncode
    text = open(path).read()
    if rc != 0:
        log(f"FAILED ({rc}): laoyao {' '.join(args[:4])} ...; last lines of {path}:\n" + "\n".join(text.splitlines()[-15:]))
    return rc, text, time.time() - t0


def iterations(text):
    """Per iteration: (elapsed ms, lm loss, learning rate) from Megatron's log lines."""
    rows = {}
    for line in text.splitlines():
        m = re.search(r"iteration\s+(\d+)/", line)
        if not m or "lm loss" not in line:
            continue
        ms = re.search(r"elapsed time per iteration \(ms\): ([\d.]+)", line)
        loss = re.search(r"lm loss: ([\d.E+-]+)", line)
        lr = re.search(r"learning rate: ([\d.E+-]+)", line)
        rows[int(m.group(1))] = (float(ms.group(1)), float(loss.group(1)), float(lr.group(1)))
    return rows


def peak_memory(text):
    """GB: the memory line's max allocated (Megatron's gigabytes form, or its older megabytes one)."""
    m = re.findall(r"mem-max-allocated-gigabytes: ([\d.]+)", text)
    if m:
        return float(m[-1])
    m = re.findall(r"max allocated: ([\d.]+)", text)
    return float(m[-1]) / 1024 if m else float("nan")


def tokens_per_s(rows, row_tokens, skip=5):
    times = [ms for it, (ms, _, _) in sorted(rows.items()) if it > skip]
    return row_tokens / (sum(times) / len(times) / 1e3) if times else float("nan")


def recipe_args(spec, hf, data, extra, iters=ITERS):
    return (["run-recipe", "--recipe", spec["recipe"], "checkpoint.pretrained_checkpoint=" + hf,
             "tokenizer.tokenizer_model=" + hf, "dataset.dataset_root=" + data, f"train.train_iters={iters}",
             "validation.eval_iters=0", "checkpoint.save=null", "logger.log_interval=1"] + extra)


def peer(name, spec, hf, samples_text, lrs, gbs, seq):
    """The transformers (+ PEFT) peer on laoyao's micro-batches; returns (tokens/s, losses, GB)."""
    mbs = [json.loads(l) for l in samples_text.splitlines() if l.startswith("{")]
    mbs = [m for m in mbs if m.get("split") == "train"]
    steps = int(os.environ.get("PEER_ITERS", spec["peer_iters"]))
    lora = spec["lora"]
    dtype = torch.bfloat16 if lora else torch.float32  # full SFT: fp32 weights, bf16 autocast
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, torch_dtype=dtype, attn_implementation="sdpa")
    model.to("cuda")
    model.config.use_cache = False
    if lora:
        import peft
        cfg = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                              target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                              "down_proj"])
        model = peft.get_peft_model(model, cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    # The recipes' Adam (beta2 0.98, eps 1e-8, clip 1.0; weight decay 0.1 on every parameter, as
    # near as one torch group gets to Megatron's).
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.1, fused=True)
    compiled = int(os.environ.get("PEER_COMPILE", spec["compile"]))
    fwd = torch.compile(model) if compiled else model

    def micro(m):
        ids = torch.tensor(m["tokens"], device="cuda")  # [micro-batch rows, seq]
        labels = torch.tensor(m["labels"], device="cuda").view(-1)
        mask = torch.tensor(m["loss_mask"], device="cuda", dtype=torch.float32).view(-1)
        pos = torch.tensor(m["position_ids"], device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = fwd(input_ids=ids, position_ids=pos).logits
        losses = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels, reduction="none")
        return (losses * mask).sum() / mask.sum()

    # The packed rows are kept apart: the first pack's loss equals its examples' losses one by one.
    check = ""
    first = mbs[0]
    starts = [i for i, p in enumerate(first["position_ids"][0]) if p == 0]
    if len(starts) > 1:
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            ids = torch.tensor(first["tokens"][:1], device="cuda")
            pos = torch.tensor(first["position_ids"][:1], device="cuda")
            whole = model(input_ids=ids, position_ids=pos).logits.float()
            a, b = starts[1], (starts[2] if len(starts) > 2 else ids.shape[1])
            alone = model(input_ids=ids[:, a:b], position_ids=pos[:, a:b]).logits.float()
        diff = float((whole[:, a:b] - alone).abs().max())
        check = f"packed vs alone max |dlogit| {diff:.3g}"
        log(f"{name} peer: {check}")

    by_iter = {}
    for m in mbs:
        by_iter.setdefault(m["iteration"], []).append(m)
    its = sorted(by_iter)[:steps]
    losses, times = [], []
    torch.cuda.reset_peak_memory_stats()
    for it in its:
        torch.cuda.synchronize()
        t0 = time.time()
        for g in opt.param_groups:
            g["lr"] = lrs.get(it, lrs[max(lrs)])
        total = 0.0
        for m in by_iter[it]:
            loss = micro(m) / len(by_iter[it])
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.time() - t0)
        losses.append(total)
        log(f"{name} peer iteration {it}: loss {total:.4f} {times[-1] * 1e3:.0f} ms")
    row_tokens = gbs * seq
    skip = min(5, len(times) - 2)
    tps = row_tokens / (sum(times[skip:]) / len(times[skip:]))
    gb = torch.cuda.max_memory_allocated() / 2**30
    del model, fwd, opt
    torch.cuda.empty_cache()
    return tps, dict(zip(its, losses)), gb, check, compiled


def run_case(name):
    spec = MODELS[name]
    hf = write_model(name, spec)
    data = write_rows()
    recipe = spec["recipe"]
    gbs, seq = 8, 4096
    runs = {}
    # (label, overrides, environment): packed rows attend within their examples through cuDNN's
    # attention over documents by default (auto), through our flash kernels with flash.
    variants = [("packed", [], {})]
    if not spec["lora"]:
        variants.append(("unpacked", ["dataset.packed_sequence=false"], {}))
    variants.append(("packed, flash documents", ["model.attention_backend=flash"], {}))
    for label, extra, env in variants:
        rc, text, wall = laoyao(recipe_args(spec, hf, data, extra, ITERS if label == "packed" else ITERS_AUX),
                                f"{name}_{label.replace(', ', '_').replace(' ', '_')}.txt", env)
        rows = iterations(text)
        runs[label] = (rows, text)
        if rc == 0 and rows:
            RESULTS.append((f"{name} laoyao {label}", tokens_per_s(rows, gbs * seq), peak_memory(text),
                            rows[min(rows)][1], rows[max(rows)][1], f"{len(rows)} iterations, {wall:.0f} s wall"))
    if "packed" not in runs or not runs["packed"][0]:
        return
    CURVES.append((name, {it: loss for it, (_, loss, _) in runs["packed"][0].items()}))
    rc, samples, _ = laoyao(["data-samples", "--iterations", str(int(os.environ.get("PEER_ITERS", spec["peer_iters"])))]
                            + recipe_args(spec, hf, data, [])[1:], f"{name}_samples.jsonl")
    if rc != 0:
        return
    lrs = {it: lr for it, (_, _, lr) in runs["packed"][0].items()}
    tps, losses, gb, check, compiled = peer(name, spec, hf, samples, lrs, gbs, seq)
    rows = runs["packed"][0]
    ours = tokens_per_s(rows, gbs * seq)
    last = max(losses)
    RESULTS.append((f"{name} peer (transformers{' + peft' if spec['lora'] else ''}"
                    f"{', compiled' if compiled else ''})", tps, gb, losses[min(losses)], losses[last],
                    f"{check}; laoyao at iteration {last}: {rows.get(last, (0, float('nan'), 0))[1]:.4f}"))
    RESULTS.append((f"{name} laoyao / peer", ours / tps, float("nan"), float("nan"), float("nan"), "tokens/s ratio"))
    if "unpacked" in runs and runs["unpacked"][0]:
        RESULTS.append((f"{name} packed / unpacked step", ours / tokens_per_s(runs["unpacked"][0], gbs * seq),
                        float("nan"), float("nan"), float("nan"), "same rows a step, same row length"))
    flash = runs.get("packed, flash documents")
    if flash and flash[0]:
        RESULTS.append((f"{name} packed: cuDNN / flash attention", ours / tokens_per_s(flash[0], gbs * seq),
                        float("nan"), float("nan"), float("nan"), "documents through cuDNN vs our flash kernels"))


def main():
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(WORK, exist_ok=True)
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name()}")
    for name in CASES:
        try:
            run_case(name)
        except Exception as e:  # the other case still runs; the table says what failed
            RESULTS.append((f"{name} FAILED", float("nan"), float("nan"), float("nan"), float("nan"), repr(e)[:200]))
            log(f"{name} failed: {e!r}")
    print(f"\n{'run':58s} {'tokens/s':>10s} {'GB':>6s} {'loss first':>10s} {'loss last':>10s}  note")
    for r in RESULTS:
        print(f"{r[0]:58s} {r[1]:10.1f} {r[2]:6.1f} {r[3]:10.4f} {r[4]:10.4f}  {r[5]}")
    for name, curve in CURVES:  # laoyao's packed run: the loss at iteration 1 and every 5th
        points = [f"{it}:{curve[it]:.4f}" for it in sorted(curve) if it == 1 or it % 5 == 0]
        print(f"{name} loss curve (packed): " + " ".join(points))


if __name__ == "__main__":
    main()
