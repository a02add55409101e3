"""Runs a PyTorch peer's model and step (../shared/peers/pytorch_gpt.py or pytorch_moe.py) for Nsight
Compute: the peer's own code up to its warm-up loop, 5 warm-up steps, then STEPS steps inside an NVTX
start/end range named "profile" (ncu --nvtx --nvtx-include "profile" profiles only those kernels). A
start/end range, not a push/pop one: those belong to one thread, and autograd launches the backward
from threads of its own.
Usage (on the GPU machine): python3 peer_profile_step.py PEER.py NAME [--compile] [--steps N]
Prints the steps' start and end times (bench/clock_samples.py's window)."""
import datetime
import re
import sys

import torch

peer, name = sys.argv[1], sys.argv[2]
steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 1
src = open(peer).read()
warmup = re.search(r"^for _ in range\(\d+\): step\(\)", src, re.MULTILINE)  # the peer's own warm-up loop
if not warmup:
    sys.exit(f"{peer}: no warm-up loop 'for _ in range(N): step()' to stop before")
cut = warmup.start()
sys.argv = [peer, name] + [a for a in sys.argv[3:] if a == "--compile"]
g = {"__name__": "peer"}
exec(compile(src[:cut], peer, "exec"), g)
for _ in range(5):
    g["step"]()
torch.cuda.synchronize()
rng = torch.cuda.nvtx.range_start("profile")
began = datetime.datetime.now()
for _ in range(steps):
    g["step"]()
torch.cuda.synchronize()
torch.cuda.nvtx.range_end(rng)
# The window bench/clock_samples.py reads.
ended = datetime.datetime.now()
print(f"{steps} step(s) of {name}: steps from {began:%Y-%m-%d %H:%M:%S.%f} to {ended:%Y-%m-%d %H:%M:%S.%f}")
