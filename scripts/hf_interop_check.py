#!/usr/bin/env python3
"""Checks that TrainFlow's exported weights load in Hugging Face transformers and give the same loss.

Needs python3 with torch and transformers (the GPU machine's image has both; this dev machine has
neither transformers nor a way to install it). Usage:

  hf_interop_check.py MODEL_DIR TOKENS_BIN B T BATCHES TRAINFLOW_LOSS

MODEL_DIR holds model.safetensors + config.json from `trainflow export`; TOKENS_BIN is a token file
(llm.c header + uint16); the loss is recomputed over micro-batches 0..BATCHES-1 following the data
contract of docs/data.md (micro-batch i reads tokens (i*B*T + j) mod N, j = 0..B*T) and compared with
TRAINFLOW_LOSS (what `trainflow eval` printed). Prints HF_INTEROP ok/FAIL and exits non-zero on FAIL.
"""
import sys

import numpy as np
import torch
from transformers import GPT2LMHeadModel


def read_tokens(path):
    raw = open(path, "rb").read()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    if len(raw) >= 1024 and header[0] == 20240520:
        return np.frombuffer(raw[1024:], dtype="<u2")[: header[2]].astype(np.int64)
    return np.frombuffer(raw, dtype="<u2").astype(np.int64)


def main():
    model_dir, tokens, B, T, batches, tf_loss = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]), float(sys.argv[6])
    model = GPT2LMHeadModel.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    toks = read_tokens(tokens)
    N = len(toks)
    losses = []
    with torch.no_grad():
        for i in range(batches):
            pos = (i * B * T + np.arange(B * T + 1)) % N
            window = torch.from_numpy(toks[pos])
            x, y = window[:-1].view(B, T), window[1:].view(B, T)
            logits = model(x).logits.float()
            losses.append(torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1)).item())
    hf_loss = float(np.mean(losses))
    ok = abs(hf_loss - tf_loss) <= 1e-4 * max(1.0, abs(tf_loss))
    print(f"HF_INTEROP {'ok' if ok else 'FAIL'}: transformers loss {hf_loss:.6f}, trainflow {tf_loss:.6f}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
