#!/usr/bin/env python3
"""Turns a gpu_check.sh log into a Markdown section for bench/RESULTS.md.

Usage: python3 scripts/gpu_results_md.py <files_at>/gpu_check.log [more logs of the same run]

Prints the date and machine, the summary table (tests, sanitizers, benchmarks, every end-to-end
`trainflow bench` line as ms/step, tokens/s, MFU with both FLOP counts and device memory, the GPU
training runs) and the bf16 step's GPU-time profile, all taken verbatim from the log; then the
decisions step 2 supports: each bf16 variant's ms/step against the defaults' (the only figures
computed here). Review before committing; add what the numbers mean.
"""
import re
import sys


def parse_bench(line):
    """BENCH_RESULT key=value pairs -> dict of floats (empty if none)."""
    m = re.search(r"BENCH_RESULT (.*)", line)
    if not m:
        return {}
    out = {}
    for kv in m.group(1).split():
        if "=" in kv:
            k, v = kv.split("=", 1)
            try:
                out[k] = float(v)
            except ValueError:
                pass
    return out


BASE = "GPT-2 124M B=16 T=1024 bf16"
NOISE = 0.02  # differences of medians over 20 steps below this are not decisions


def print_decisions(summary):
    """Each bf16 end-to-end variant (fusions, cuDNN attention) against the defaults' ms/step."""
    runs = {}
    for s in summary:
        what, _, rest = s.partition(": ")
        b = parse_bench(rest)
        if b.get("ms_per_step") and (what == BASE or what.startswith(BASE + " ")):
            runs[what] = b["ms_per_step"]
    base = runs.get(BASE)
    if not base or len(runs) < 2:
        return
    print()
    print(f"Defaults vs each switch (bf16, ms/step; under {100 * NOISE:.0f}% is noise, not a decision):")
    print()
    print("| variant | ms/step | vs defaults |")
    print("|---|---|---|")
    for what, ms in runs.items():
        if what == BASE:
            continue
        gain = (base - ms) / base
        verdict = "within noise" if abs(gain) < NOISE else (f"{100 * gain:.1f}% faster" if gain > 0
                                                            else f"{-100 * gain:.1f}% slower")
        print(f"| {what[len(BASE) + 1:]} | {ms:.2f} | {verdict} |")
    best = min(runs, key=runs.get)
    print()
    print(f"Fastest: {best} ({runs[best]:.2f} ms/step; defaults {base:.2f}).")


def main(paths):
    text = ""
    for p in paths:
        with open(p, encoding="utf-8", errors="replace") as f:
            text += f.read()
    lines = text.splitlines()
    header = next((l for l in lines if l.startswith("== gpu_check ")), "== gpu_check (date unknown)")
    gpu = ""
    for i, l in enumerate(lines):
        if l.startswith("== gpu_check ") and i + 1 < len(lines):
            gpu = lines[i + 1].strip()
            break
    try:
        start = max(i for i, l in enumerate(lines) if l.startswith("== summary"))
    except ValueError:
        sys.exit("no '== summary' section in the log: the check did not finish")
    summary = [l.strip() for l in lines[start + 1:] if l.startswith("  ")]
    budget = lines[start]

    print(f"### GPU check: {header[len('== gpu_check '):]}")
    print()
    print(f"Machine: {gpu or 'unknown (nvidia-smi printed nothing)'}. Command: `bash scripts/gpu_check.sh` "
          f"(device tool, carry `gpu_carry`, bundle from `bash scripts/gpu_bundle.sh`); {budget.strip('= ')}.")
    print()
    print("| what | result |")
    print("|---|---|")
    profile = []
    for s in summary:
        if s.startswith("PROFILE ") or s.startswith("cuDNN PROFILE "):
            profile.append(s)
            continue
        what, _, rest = s.partition(": ")
        b = parse_bench(rest)
        if b:
            cells = [f"{b.get('ms_per_step', 0):.2f} ms/step", f"{b.get('tokens_per_s', 0):,.0f} tok/s"]
            if "mfu" in b:
                cells.append(f"MFU {100 * b['mfu']:.1f}% (6·params)")
            if "mfu_with_attention" in b:
                cells.append(f"{100 * b['mfu_with_attention']:.1f}% with attention FLOPs")
            if b.get("device_used_gb"):
                cells.append(f"{b['device_used_gb']:.1f} GB in use")
            print(f"| {what} | {', '.join(cells)} |")
        else:
            print(f"| {what} | {rest.replace('|', '/')} |")
    print_decisions(summary)
    if profile:
        print()
        print("GPU time per step by piece of work (bf16 defaults; `trainflow bench --profile-steps`):")
        print()
        print("| piece | ms/step | share | calls/step | roofline ms | at % of roofline |")
        print("|---|---|---|---|---|---|")
        for p in profile:
            m = re.match(r"(cuDNN )?PROFILE (.+?)\s+([0-9.]+) ms\s+([0-9.]+)%\s+([0-9.]+) calls"
                         r"(?:\s+roofline\s+([0-9.]+) ms, at\s+([0-9.]+)%)?", p)
            if m:
                name = ("cuDNN " if m.group(1) else "") + m.group(2).strip()
                roof = f"{m.group(6)} | {m.group(7)}%" if m.group(6) else "- | -"
                print(f"| {name} | {m.group(3)} | {m.group(4)}% | {m.group(5)} | {roof} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
