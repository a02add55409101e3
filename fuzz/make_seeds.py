#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/ (fuzz/corpus/<target>/): small valid inputs from which
libFuzzer mutates. Run once after changing it; the files are committed (scripts/fuzz.sh reads them).
Usage: python3 fuzz/make_seeds.py [path to a built laoyao binary, for the YAML seed]"""
import json, os, struct, subprocess, sys

ROOT = os.path.dirname(os.path.abspath(__file__))
SEP = b"\n--laoyao-fuzz-part--\n"  # fuzz_util.hpp's kSeparator


def put(target, name, data):
    d = os.path.join(ROOT, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def config_seeds(laoyao):
    mlm = ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
           "--max-position-embeddings 128 --micro-batch-size 2 --global-batch-size 4 --train-iters 10 "
           "--eval-interval 5 --eval-iters 2 --mock-data --tokenizer-type NullTokenizer --vocab-size 1000 "
           "--lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --bf16 --swiglu "
           "--normalization RMSNorm --position-embedding-type rope --num-experts 4 --moe-router-topk 2")
    put("config", "mlm", b"\x00" + mlm.encode())
    overrides = ["model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4", "train.train_iters=10",
                 "optimizer.lr=3e-4", "dataset.seq_length=128", "model.seq_length=128",
                 "+env_vars.NCCL_DEBUG=INFO", "~model.ffn_hidden_size", "logger.log_interval=1",
                 "model.moe_layer_freq=[1,0]", "checkpoint.save='/tmp/a b'", "validation.eval_interval=null"]
    put("config", "overrides", b"\x01" + "\n".join(overrides).encode())
    yaml = "model:\n  num_layers: &n 2\n  hidden_size: 64\ntrain:\n  train_iters: *n\n  global_batch_size: 4\n"
    if laoyao:
        yaml = subprocess.run([laoyao, "recipes", "show", "vanilla_gpt_pretrain_config",
                               "model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4"],
                              check=True, capture_output=True, text=True).stdout
    put("config", "yaml", b"\x02" + yaml.encode())
    put("config", "yaml_anchors", b"\x02" + b"model: &m\n  num_layers: 2\n  hidden_size: 64\n  num_attention_heads: 4\n"
        b"train: {train_iters: 10, micro_batch_size: 1}\nvalidation: {eval_iters: 1}\n")


def idx(dtype_code, itemsize, fmt, seqs, docs):
    lengths = [len(s) for s in seqs]
    pointers, p = [], 0
    for n in lengths:
        pointers.append(p)
        p += n * itemsize
    head = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, dtype_code, len(seqs), len(docs))
    body = struct.pack(f"<{len(seqs)}i", *lengths) + struct.pack(f"<{len(seqs)}q", *pointers)
    body += struct.pack(f"<{len(docs)}q", *docs)
    binary = b"".join(struct.pack(f"<{len(s)}{fmt}", *s) for s in seqs)
    return head + body + SEP + binary


def indexed_dataset_seeds():
    seqs = [[5, 17, 2], [9], [300, 1]]
    put("indexed_dataset", "uint16", idx(8, 2, "H", seqs, [0, 1, 2, 3]))
    put("indexed_dataset", "int32_sentences", idx(4, 4, "i", seqs + [[70000, 3, 3, 3]], [0, 2, 4]))


def safetensors_seed():
    header = {"__metadata__": {"format": "pt"},
              "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
              "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]},
              "c": {"dtype": "F16", "shape": [1], "data_offsets": [22, 24]}}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    data = struct.pack("<4f", 1.0, -2.5, 3.0e-3, 7.0) + struct.pack("<3H", 0x3F80, 0xC000, 0x7F80) + b"\x00\x3c"
    put("safetensors", "small", struct.pack("<Q", len(h)) + h + data)


def byte_level_alphabet():
    """GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest above U+0100."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + n))
            n += 1
    return chars


def pb_varint(v):
    out = b""
    while v >= 0x80:
        out += bytes([(v & 0x7F) | 0x80])
        v >>= 7
    return out + bytes([v])


def pb_bytes(field, data):
    return pb_varint(field << 3 | 2) + pb_varint(len(data)) + data


def pb_u(field, v):
    return pb_varint(field << 3) + pb_varint(v & 0xFFFFFFFFFFFFFFFF)


def pb_f32(field, f):
    return pb_varint(field << 3 | 5) + struct.pack("<f", f)


def sentencepiece_model(model_type):
    ws = "\u2581"
    pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3), (ws, -1.0, 1), ("a", -2.0, 1),
              ("b", -2.0, 1), ("c", -2.0, 1), (ws + "a", -3.0, 1), ("ab", -3.5, 1)]
    pieces += [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]  # byte_fallback models hold all 256
    m = b""
    for piece, score, typ in pieces:
        sp = pb_bytes(1, piece.encode()) + pb_f32(2, score) + (pb_u(3, typ) if typ != 1 else b"")
        m += pb_bytes(1, sp)
    trainer = pb_u(3, model_type) + pb_u(4, len(pieces)) + pb_u(35, 1) + pb_u(43, -1)
    m += pb_bytes(2, trainer)
    m += pb_bytes(3, pb_bytes(1, b"identity") + pb_u(4, 1))
    return m


def tokenizer_seeds():
    alphabet = byte_level_alphabet()
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = [("\u0120", "t"), ("h", "e"), ("\u0120t", "he"), ("l", "o")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    text = b"the hello \xc3\xa9t\xc3\xa9 123"
    merges_txt = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
    put("tokenizer_files", "gpt2", b"\x00" + json.dumps(vocab).encode() + SEP + merges_txt.encode() + SEP + text)
    hf = {"version": "1.0",
          "added_tokens": [{"id": len(vocab) - 1, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                            "rstrip": False, "normalized": False, "special": True}],
          "normalizer": None,
          "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
          "post_processor": None, "decoder": {"type": "ByteLevel"},
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False, "byte_fallback": False,
                    "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]}}
    config = {"eos_token": "<|endoftext|>", "add_bos_token": False}
    put("tokenizer_files", "hf", b"\x01" + json.dumps(hf).encode() + SEP + json.dumps(config).encode() + SEP + text)
    put("tokenizer_files", "sentencepiece_bpe", b"\x02" + sentencepiece_model(2) + SEP + SEP + b"abc aab cab")
    put("tokenizer_files", "sentencepiece_unigram", b"\x05" + sentencepiece_model(1) + SEP + SEP + b"ab ca A")


def run_records_seeds(laoyao):
    """A training log, a checkpoint's train_state.json and a tracker, from a tiny CPU run."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        args = [laoyao, "pretrain-gpt", "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
                "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "1",
                "--global-batch-size", "2", "--train-iters", "3", "--eval-interval", "2", "--eval-iters", "1",
                "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "64", "--lr", "1e-3",
                "--log-interval", "1", "--save", os.path.join(d, "ckpt"), "--save-interval", "3"]
        log = subprocess.run(args, check=True, capture_output=True, text=True, cwd=d,
                             env=dict(os.environ, LAOYAO_DEVICE="cpu")).stdout
        with open(os.path.join(d, "ckpt", "iter_0000003", "train_state.json"), "rb") as f:
            state = f.read()
    put("run_records", "log", b"\x00" + log.encode())
    put("run_records", "train_state", b"\x01" + state)
    put("run_records", "tracker", b"\x02" + b"3")


def hf_folder_seeds():
    llama = {"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "intermediate_size": 24,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
             "vocab_size": 64, "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
             "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192}, "tie_word_embeddings": True}
    moe = dict(llama, architectures=["Qwen3MoeForCausalLM"], num_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=8, norm_topk_prob=True, mlp_only_layers=[], rope_scaling=None)
    gpt2 = {"architectures": ["GPT2LMHeadModel"], "n_embd": 12, "n_layer": 1, "n_head": 3, "n_positions": 32,
            "vocab_size": 50, "activation_function": "gelu_new"}
    index = {"metadata": {"total_size": 100}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                                                             "lm_head.weight": "model-00002-of-00002.safetensors"}}
    put("hf_folder", "llama", json.dumps(llama).encode())
    put("hf_folder", "qwen3_moe", json.dumps(moe).encode() + SEP + json.dumps(index).encode())
    put("hf_folder", "gpt2", json.dumps(gpt2).encode() + SEP + json.dumps(index).encode())


def chat_template_seeds():
    vocabs = os.path.join(ROOT, "..", "build", "test-vocabs")
    for model in ("llama3", "qwen3"):
        path = os.path.join(vocabs, model, "tokenizer_config.json")
        if os.path.exists(path):
            put("chat_template", model, json.load(open(path))["chat_template"].encode())
    put("chat_template", "features",
        b"{%- set ns = namespace(n=0) -%}{% for m in messages if m.role != 'tool' %}{% set ns.n = ns.n + 1 %}"
        b"{{ loop.index }}:{{ m['role'] | upper }} {{ m.content.split('</think>')[-1] | trim | tojson }}"
        b"{% if m.tool_calls is defined %}{{ m.tool_calls[0].function.arguments | tojson(indent=2) }}{% endif %}"
        b"{% else %}none{% endfor %}{{ ns.n ~ (' ' * 3) ~ [1, 2.5, none][::-1] }}{% raw %}{{x}}{% endraw %}"
        + SEP + b'[{"role": "user", "content": "hi"}]')


if __name__ == "__main__":
    binary = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else None
    config_seeds(binary)
    indexed_dataset_seeds()
    safetensors_seed()
    tokenizer_seeds()
    hf_folder_seeds()
    chat_template_seeds()
    if binary:
        run_records_seeds(binary)
