#!/usr/bin/env python3
"""import-hf and export-hf speed and peak host memory on a Llama-shaped Hugging Face folder of random
BF16 weights (written here with the standard library: no torch needed), sharded as transformers
shards (5 GB files with model.safetensors.index.json).

Usage: python3 bench/hf_convert_bench.py LAOYAO_BINARY WORK_DIR [SHAPE]
  SHAPE: llama3_8b (8.0B parameters, 16 GB), llama32_1b (1.2B, 2.5 GB) or small (0.5B, 1 GB; default)
Prints a table: step, GB, seconds, GB/s, CPU seconds (user + system: against the seconds, how much
of the time waited on the disk), peak host memory (GB) and its ratio to the largest tensor.
The folders are removed at the end.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time

SHAPES = {  # hidden, ffn, layers, heads, groups, vocab
    "llama3_8b": (4096, 14336, 32, 32, 8, 128256),
    "llama32_1b": (2048, 8192, 16, 32, 8, 128256),
    "small": (2048, 5632, 8, 16, 4, 32000),
}


def tensors(h, f, layers, heads, groups, vocab):
    d = h // heads
    yield "model.embed_tokens.weight", (vocab, h)
    for l in range(layers):
        p = f"model.layers.{l}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "self_attn.q_proj.weight", (heads * d, h)
        yield p + "self_attn.k_proj.weight", (groups * d, h)
        yield p + "self_attn.v_proj.weight", (groups * d, h)
        yield p + "self_attn.o_proj.weight", (h, heads * d)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "mlp.gate_proj.weight", (f, h)
        yield p + "mlp.up_proj.weight", (f, h)
        yield p + "mlp.down_proj.weight", (h, f)
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (vocab, h)


def write_folder(path, shape):
    h, f, layers, heads, groups, vocab = shape
    os.makedirs(path)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
              "intermediate_size": f, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": groups, "head_dim": h // heads, "vocab_size": vocab,
              "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
              "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    with open(os.path.join(path, "config.json"), "w") as fp:
        json.dump(config, fp)
    shards, current, size = [], [], 0
    for name, s in tensors(*shape):
        n = 2
        for x in s:
            n *= x
        if current and size + n > 5_000_000_000:
            shards.append(current)
            current, size = [], 0
        current.append((name, s, n))
        size += n
    shards.append(current)
    block = os.urandom(1 << 24)
    block = bytes(b & 0x3F if i % 2 else b for i, b in enumerate(block))  # finite bf16 values (|x| < 2)
    weight_map, largest = {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        header, off = {}, 0
        for name, s, n in shard:
            header[name] = {"dtype": "BF16", "shape": list(s), "data_offsets": [off, off + n]}
            off += n
            weight_map[name] = fname
            largest = max(largest, n)
        text = json.dumps(header).encode()
        text += b" " * ((8 - len(text) % 8) % 8)
        with open(os.path.join(path, fname), "wb") as fp:
            fp.write(len(text).to_bytes(8, "little") + text)
            left = off
            while left > 0:
                chunk = block[: min(left, len(block))]
                fp.write(chunk)
                left -= len(chunk)
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as fp:
        json.dump({"metadata": {"total_size": sum(n for sh in shards for _, _, n in sh)}, "weight_map": weight_map}, fp)
    return largest


def timed(cmd):
    start = time.time()
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1))
    cpu = sum(float(re.search(rf"{k} time \(seconds\): ([0-9.]+)", p.stderr).group(1)) for k in ("User", "System"))
    return time.time() - start, peak_kb * 1024, cpu


def main():
    laoyao, work = sys.argv[1], sys.argv[2]
    name = sys.argv[3] if len(sys.argv) > 3 else "small"
    shape = SHAPES[name]
    root = os.path.join(work, f"hf_convert_{name}")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    try:
        largest = write_folder(os.path.join(root, "hf"), shape)
        total = sum(os.path.getsize(os.path.join(root, "hf", f)) for f in os.listdir(os.path.join(root, "hf")))
        rows = []
        s, peak, cpu = timed([laoyao, "checkpoint", "import-hf", os.path.join(root, "hf"), os.path.join(root, "imported")])
        rows.append(("import-hf (bf16)", total, s, peak, cpu))
        s, peak, cpu = timed([laoyao, "checkpoint", "export-hf", os.path.join(root, "imported"), os.path.join(root, "exported")])
        rows.append(("export-hf (bf16)", total, s, peak, cpu))
        print(f"\n{name}: {total / 1e9:.2f} GB of BF16 weights, largest tensor {largest / 1e9:.2f} GB\n")
        print("| step | GB | s | GB/s | CPU s (user + sys) | peak host GB | peak / largest tensor |")
        print("|---|---|---|---|---|---|---|")
        for step, b, s, peak, cpu in rows:
            print(f"| {step} | {b / 1e9:.2f} | {s:.1f} | {b / 1e9 / s:.2f} | {cpu:.1f} | {peak / 1e9:.2f} | {peak / largest:.1f} |")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
