"""Cross-check, on the GPU machine (which has the Python tokenizer packages), that laoyao's
tokenizers give the same ids as the libraries Megatron-LM calls, on real English text.

Usage: python3 tokenizer_crosscheck.py VOCABS INPUT.jsonl OUTDIR
OUTDIR holds laoyao preprocess-data outputs named <name>_text_document.{bin,idx} for the names
below; each document is compared token for token with what Megatron's tokenizer classes produce
(GPT2BPETokenizer: transformers' GPT2Tokenizer; HuggingFaceTokenizer: AutoTokenizer(text).input_ids;
SentencePieceTokenizer: sentencepiece encode_as_ids), plus the appended EOD.
A test tool: nothing in laoyao runs Python."""
import json, struct, sys
import numpy as np

vocabs, inp, outdir = sys.argv[1], sys.argv[2], sys.argv[3]
docs = [json.loads(l)["text"] for l in open(inp, encoding="utf-8") if l.strip()]
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}

def read_indexed(prefix):
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00", "bad magic"
    version, code, n, d = struct.unpack_from("<QBQQ", idx, 9)
    lengths = np.frombuffer(idx, np.int32, n, 34)
    pointers = np.frombuffer(idx, np.int64, n, 34 + 4 * n)
    dt = DTYPES[code]
    data = np.fromfile(prefix + ".bin", dt)
    return [data[p // np.dtype(dt).itemsize: p // np.dtype(dt).itemsize + l].tolist() for p, l in zip(pointers, lengths)]

def megatron_ids(name):
    if name == "gpt2":
        from transformers import GPT2Tokenizer
        t = GPT2Tokenizer(f"{vocabs}/gpt2/vocab.json", f"{vocabs}/gpt2/merges.txt")
        eod = t.convert_tokens_to_ids("<|endoftext|>")
        return [t.encode(x) + [eod] for x in docs]
    if name in ("llama3", "qwen3"):
        from transformers import AutoTokenizer
        t = AutoTokenizer.from_pretrained(f"{vocabs}/{name}")
        return [t(x).input_ids + [t.eos_token_id] for x in docs]
    if name in ("llama2_spm", "llama2_gptspm"):
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=f"{vocabs}/sentencepiece/llama2.model")
        # Megatron's SentencePieceTokenizer adds <CLS>, <SEP>, <EOD>, ... after the model's pieces,
        # so its eod is vocab + 2; GPTSentencePieceTokenizer's eod is the model's eos.
        eod = sp.vocab_size() + 2 if name == "llama2_spm" else sp.eos_id()
        return [sp.encode_as_ids(x) + [eod] for x in docs]
    raise ValueError(name)

failures = 0
for name in ["gpt2", "llama3", "qwen3", "llama2_spm", "llama2_gptspm"]:
    ours = read_indexed(f"{outdir}/{name}_text_document")
    want = megatron_ids(name)
    bad = [i for i, (a, b) in enumerate(zip(ours, want)) if a != b]
    n_tok = sum(len(w) for w in want)
    if len(ours) != len(want):
        bad.append(-1)
    print(f"{name:12s} documents {len(want):5d} tokens {n_tok:8d} mismatching documents {len(bad)}")
    for i in bad[:3]:
        if i >= 0:
            a, b = ours[i], want[i]
            j = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
            print(f"   doc {i}: first difference at token {j}: ours {a[j:j+5]} vs {b[j:j+5]}; text {docs[i][:80]!r}")
    failures += len(bad)

# numpy: the mock corpus lengths Megatron draws, on this machine's numpy.
lengths = np.random.default_rng(0).integers(1, 4096, size=100000, dtype=np.int32)
ok = lengths[:12].tolist() == [3484, 2609, 2094, 1105, 1261, 168, 309, 68, 718, 3331, 2660, 3738] and int(lengths.sum()) == 204637097
print(f"numpy {np.__version__}: mock lengths as laoyao's tests expect: {ok}")
failures += 0 if ok else 1
sys.exit(1 if failures else 0)
