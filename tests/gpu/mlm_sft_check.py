#!/usr/bin/env python3
"""laoyao's `pretrain-gpt --sft` rows against Megatron-LM's own SFTTokenizer on the same data.

Megatron-LM's megatron/core/tokenizers/text/libraries/sft_tokenizer.py needs only numpy and
transformers, so it is loaded from its file as it is (staged beside laoyao by
`bash bench/finetune_bench.sh stage` from the Megatron-LM mirror); its SFTDataset.__getitem__, which
needs Megatron's dataset classes, is restated below step for step (split at system messages, pack,
pad to 2 CP, cut, pad, shift; the last case's short rows are cut). Random conversations (several a line, contents with outer spaces,
"/think" markers, Unicode), a Nemotron-like tokenizer (Qwen3's with Nemotron's <SPECIAL_*> markers,
as tests/data/nemotron_like_tokenizer.hpp makes it); each prompt format's rows from `laoyao
data-samples` compared token for token: tokens, labels where the loss counts, the loss mask,
positions, and each token's first key from the conversations' boundaries (cu_seqlens).

  python3 tests/gpu/mlm_sft_check.py LAOYAO QWEN3_TOKENIZER_DIR SFT_TOKENIZER_PY WORK_DIR
"""
import importlib.util
import json
import os
import random
import subprocess
import sys

import numpy as np

IGNORE_INDEX = -100


def nemotron_like(qwen3, out):
    os.makedirs(out, exist_ok=True)
    t = json.load(open(os.path.join(qwen3, "tokenizer.json")))
    nid = max(a["id"] for a in t["added_tokens"]) + 1
    for name in ["<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<SPECIAL_233>"]:
        t["added_tokens"].append({"id": nid, "content": name, "single_word": False, "lstrip": False,
                                  "rstrip": False, "normalized": False, "special": True})
        nid += 1
    json.dump(t, open(os.path.join(out, "tokenizer.json"), "w"))
    c = json.load(open(os.path.join(qwen3, "tokenizer_config.json")))
    c["unk_token"] = "<unk>"
    # transformers also reads the added tokens from tokenizer_config.json's added_tokens_decoder.
    for a in t["added_tokens"]:
        c.setdefault("added_tokens_decoder", {})[str(a["id"])] = {
            k: a[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
    json.dump(c, open(os.path.join(out, "tokenizer_config.json"), "w"))


def rows(n, seed):
    rng = random.Random(seed)
    words = ["river", "north", "42", "héllo", "你好", "/think", "/no_think", "a", "the", "count", "mat", "7.5"]
    text = lambda k: (" " if rng.random() < 0.2 else "") + " ".join(rng.choice(words) for _ in range(k)) + \
        (" " if rng.random() < 0.2 else "")
    out = []
    for _ in range(n):
        msgs = []
        for _ in range(rng.randint(1, 3)):
            msgs.append({"role": "system", "content": "Be " + text(rng.randint(1, 4))})
            for _ in range(rng.randint(1, 3)):
                msgs.append({"role": "user", "content": "Q " + text(rng.randint(1, 9))})
                msgs.append({"role": "assistant", "content": "A " + text(rng.randint(1, 12))})
        out.append({"messages": msgs})
    return out


def megatron_sample(tokenizer, messages, pack_length, cp_size):
    """SFTDataset.__getitem__, restated."""
    convs, current = [], []
    for msg in messages:
        if msg["role"] == "system":
            if current:
                convs.append(current)
            current = [msg]
        else:
            current.append(msg)
    if current:
        convs.append(current)
    pad = tokenizer.pad_id
    toks, tgts, pos, cu = [], [], [], [0]

    def extend(n):
        toks.extend([pad] * n)
        tgts.extend([pad] * n)
        pos.extend(range(pos[-1] + 1, pos[-1] + 1 + n))

    for conv in convs:
        t, g = tokenizer.tokenize_conversation(conv, return_target=True, add_generation_prompt=False)
        toks.extend(t.tolist())
        tgts.extend(g.tolist())
        pos.extend(range(len(t)))
        if cp_size > 1:
            m = len(toks) % (2 * cp_size)
            if m:
                extend(2 * cp_size - m)
        cu.append(len(toks))
        if len(toks) >= pack_length + 1:
            toks, tgts = toks[:pack_length] + [pad], tgts[:pack_length] + [pad]
            pos = pos[:pack_length + 1]
            cu[-1] = len(toks) - 1
            break
    if len(toks) < pack_length + 1:
        extend(pack_length + 1 - len(toks))
        cu[-1] = len(toks) - 1
    labels = np.array(tgts[1:])
    mask = np.ones(pack_length, dtype=np.float32)
    mask[labels == pad] = 0.0
    mask[labels == IGNORE_INDEX] = 0.0
    first_key = [0] * pack_length
    for d in range(len(cu) - 1):
        for k in range(cu[d], min(cu[d + 1], pack_length)):
            first_key[k] = cu[d]
    return toks[:-1], labels.tolist(), mask.tolist(), pos[:-1], first_key


def main():
    laoyao, qwen3, sft_py, work = sys.argv[1:5]
    tok_dir = os.path.join(work, "nemotron_tok")
    nemotron_like(qwen3, tok_dir)
    spec = importlib.util.spec_from_file_location("sft_tokenizer", sft_py)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    data = rows(24, 5)
    path = os.path.join(work, "sft.jsonl")
    with open(path, "w") as f:
        for r in data:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    failures = 0
    # (Context parallelism's padding needs CP ranks to print rows: tests/data/mlm_sft_dataset_test.cpp.)
    for fmt, seq, cp in [("nemotron-h-aligned", 96, 1), ("nemotron-nano-v2", 128, 1), ("default", 160, 1),
                         ("nemotron-h-aligned", 40, 1)]:
        tokenizer = mod.SFTTokenizer(tok_dir, fmt)
        iters = len(data) + 3  # past the end: the lines wrap
        cmd = [laoyao, "data-samples", "--iterations", str(iters), "--sft", "--tokenizer-type", "SFTTokenizer",
               "--tokenizer-model", tok_dir, "--sft-tokenizer-prompt-format", fmt,
               "--no-create-attention-mask-in-dataloader", "--data-path", path, "--split", "100,0,0",
               "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", str(seq),
               "--max-position-embeddings", str(seq), "--micro-batch-size", "1", "--global-batch-size", "1",
               "--train-iters", str(iters), "--lr", "1e-3", "--eval-interval", str(iters + 1), "--eval-iters", "0",
               "--position-embedding-type", "rope", "--context-parallel-size", str(cp)]
        env = dict(os.environ, LAOYAO_DEVICE="cpu")
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if out.returncode != 0:
            print(f"{fmt} cp={cp}: laoyao failed: {out.stdout[-800:]} {out.stderr[-800:]}")
            failures += 1
            continue
        got = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
        bad = 0
        for g in got:
            i = g["sample_indices"][0]
            t, lab, m, p, k = megatron_sample(tokenizer, data[i % len(data)]["messages"], seq, cp)
            ours = (g["tokens"][0], g["loss_mask"][0], g["position_ids"][0], g["attention_key_start"][0])
            labels_ok = all(a == b for a, b, w in zip(g["labels"][0], lab, m) if w > 0)
            if ours != (t, m, p, k) or not labels_ok:
                bad += 1
                if bad <= 2:
                    print(f"{fmt} cp={cp} sample {i}: differs\n  megatron tokens {t}\n  laoyao   tokens {ours[0]}\n"
                          f"  megatron mask {m}\n  laoyao   mask {ours[1]}")
        counted = sum(sum(g["loss_mask"][0]) for g in got)
        print(f"{fmt} cp={cp} seq={seq}: {len(got)} rows, {int(counted)} loss tokens, "
              f"{'equal to Megatron-LM' if bad == 0 else f'{bad} rows differ'}")
        failures += bad > 0 or len(got) != iters
    print("PASS" if failures == 0 else f"FAIL ({failures})")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
