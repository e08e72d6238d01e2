#!/usr/bin/python3
"""Time one GPT-2 training step in float32 PyTorch on the CPU (baseline for TrainFlow).

One step = forward, mean cross-entropy loss, backward, AdamW step, zero_grad.
The model is the same plain-PyTorch GPT-2 as scripts/pytorch_reference.py (HF layout
semantics: learned wpe, pre-LN blocks, causal attention via a manual masked softmax as in
nanoGPT -- torch 1.13 has no F.scaled_dot_product_attention --, GELU tanh, tied lm head),
built from nn.Linear / nn.LayerNorm / nn.Embedding for speed.

Example (GPT-2 small, 1 thread):
    /usr/bin/python3 scripts/pytorch_bench.py --n_layer 12 --n_head 12 --n_embd 768 \
        --block_size 1024 --batch 4 --seq 64 --threads 1

Last output line:  PYTORCH_RESULT ms_per_step=<x> tokens_per_s=<y> params=<n>
(params counts every parameter once, wte/lm_head tied, wpe included; the GFLOP/s line
uses 6 * (params without wpe) * tokens per step.)
"""

import argparse
import math
import re
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, n_head, block_size):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)
        self.register_buffer("mask", torch.tril(torch.ones(block_size, block_size, dtype=torch.bool))
                             .view(1, 1, block_size, block_size), persistent=False)

    def attn(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, vocab_size, block_size):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head, block_size) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)
        # GPT-2 init
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02
                if name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight"):
                    std = 0.02 / math.sqrt(2 * n_layer)
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias") and "ln_" not in name:
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for blk in self.h:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied lm head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def blas_report():
    cfg = torch.__config__.show()
    # the BLAS facts are inside the long "Build settings:" line; print just those fields
    fields = ["%s=%s" % kv for kv in
              re.findall(r"\b(BLAS_INFO|LAPACK_INFO|USE_MKL|USE_MKLDNN|USE_OPENMP)=([^,\s]+)", cfg)]
    extra = [l.strip() for l in cfg.splitlines() if ("BLAS" in l or "LAPACK" in l) and "Build settings" not in l]
    print("torch.__config__.show() BLAS:", ", ".join(fields) or "(no BLAS_INFO)",
          ("| " + " | ".join(extra)) if extra else "")
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6:
                path = parts[5]
                low = path.lower()
                if any(s in low for s in ("blas", "lapack", "mkl", "libgomp", "libomp", "libiomp")):
                    libs.add(path)
    print("loaded BLAS/OpenMP libraries (/proc/self/maps):")
    for p in sorted(libs):
        print("   ", p)
    if not any("blas" in p.lower() or "mkl" in p.lower() for p in libs):
        print("    (no BLAS library mapped)")
    omp = any("openblas-openmp" in p for p in libs)
    pth = any("openblas-pthread" in p for p in libs)
    print("OpenBLAS variant:", "openmp" if omp else "pthread" if pth else "not OpenBLAS / unknown")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n_layer", type=int, default=12)
    ap.add_argument("--n_head", type=int, default=12)
    ap.add_argument("--n_embd", type=int, default=768)
    ap.add_argument("--vocab_size", type=int, default=50257)
    ap.add_argument("--block_size", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave default)")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    assert args.n_embd % args.n_head == 0 and args.seq <= args.block_size

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"interop threads {torch.get_num_interop_threads()}")

    model = GPT(args.n_layer, args.n_head, args.n_embd, args.vocab_size, args.block_size)
    params = sum(p.numel() for p in model.parameters())
    params_nowpe = params - model.wpe.weight.numel()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    idx = torch.randint(0, args.vocab_size, (args.batch, args.seq))
    tgt = torch.randint(0, args.vocab_size, (args.batch, args.seq))
    tokens = args.batch * args.seq

    blas_report()
    print(f"config: n_layer={args.n_layer} n_head={args.n_head} n_embd={args.n_embd} "
          f"vocab_size={args.vocab_size} block_size={args.block_size} batch={args.batch} seq={args.seq}")
    print(f"params: {params} (tied wte counted once, wpe included); without wpe: {params_nowpe}")

    def step():
        loss = model(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    first = None
    for _ in range(args.warmup):
        l = step()
        first = l if first is None else first
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        l = step()
        times.append(time.perf_counter() - t0)
        first = l if first is None else first
    ms = statistics.median(times) * 1e3
    tps = tokens / (ms / 1e3)
    gflops = 6.0 * params_nowpe * tokens / (ms / 1e3) / 1e9
    print(f"loss: first {first:.4f} last {l:.4f}")
    print("step times ms: " + " ".join(f"{t*1e3:.0f}" for t in times))
    print(f"step times ms: min {min(times)*1e3:.2f} median {ms:.2f} max {max(times)*1e3:.2f} "
          f"over {args.steps} steps after {args.warmup} warmup")
    print(f"median {ms:.3f} ms/step, {tps:.1f} tokens/s, "
          f"{gflops:.2f} GFLOP/s (6 * params_without_wpe * tokens; attention FLOPs not counted)")
    print(f"PYTORCH_RESULT ms_per_step={ms:.3f} tokens_per_s={tps:.1f} params={params}")


if __name__ == "__main__":
    main()
