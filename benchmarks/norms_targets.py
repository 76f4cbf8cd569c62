"""Tally the layer-norm / batch-norm issue's speed targets from a
bench_norms.py result file (default: results/norms_latest.json).

    python benchmarks/norms_targets.py [results.json]

Ratios are torch / cynorm (the plain call, no out=); % STREAM is the
minimal traffic ("MiB moved") over the time, against the triad that
bench_norms.py measured at the same thread count in the same run (with
streamed stores, stream_bounds.c).  A file that holds one allocation
setting is tallied for that one.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_norms import OP_LABEL as LABEL, OPS  # noqa: E402  (the file's writer)
# share of STREAM triad asked for, fault-free
STREAM_TARGET = {"layer_norm_fwd": 0.80, "batch_norm_fwd_eval": 0.80, "layer_norm_bwd": 0.70,
                 "batch_norm_fwd_train": 0.70, "batch_norm_bwd": 0.70}


def ratio(r):
    return r["ms"]["torch"] / r["ms"]["cynorm"]


def stream_share(r, stream):
    return r["bytes"] / (r["ms"]["cynorm"] * 1e-3) / 1e9 / stream[str(r["threads"])]


def name(r):
    return (f"{r['threads']} thr {LABEL[r['op']]} {r['dtype']} {tuple(r['shape'])} "
            f"{r['layout']}")


def tally(data):
    stream = data["stream_gbs"]
    default, faultfree = data["results"].get("default", []), data["results"].get("faultfree", [])
    rows = []

    def count(label, cases, ok, show_misses=True):
        hits = [r for r in cases if ok(r)]
        misses = [r for r in cases if not ok(r)]
        rows.append((label, f"{len(hits)} of {len(cases)}"))
        if show_misses and misses:
            worst = sorted(misses, key=ratio)[:3]
            rows.append(("", "lowest: " + "; ".join(f"{name(r)} {ratio(r):.2f}" for r in worst)))

    count("(a) default, >= 1.5 on DRAM-bound cases", [r for r in default if r["dram_bound"]],
          lambda r: ratio(r) >= 1.5, show_misses=False)
    count("(a) default, >= 1.0 on the other cases", [r for r in default if not r["dram_bound"]],
          lambda r: ratio(r) >= 1.0)
    count("(b) fault-free, >= 1.1 on DRAM-bound cases",
          [r for r in faultfree if r["dram_bound"]], lambda r: ratio(r) >= 1.1)
    count("(b) fault-free, % of STREAM (80 % LN fwd and BN eval; 70 % the rest)",
          [r for r in faultfree if r["op"] in STREAM_TARGET],
          lambda r: stream_share(r, stream) >= STREAM_TARGET[r["op"]], show_misses=False)
    train = [r for r in faultfree if r["op"] == "batch_norm_fwd_train"
             and r["layout"] == "NCHW" and tuple(r["shape"]) == (32, 64, 56, 56)]
    count("(b) BN training forward N,C,H,W (32, 64, 56, 56) >= 3x torch", train,
          lambda r: ratio(r) >= 3.0)
    slower = sum(ratio(r) < 1.0 for r in default + faultfree)
    rows.append(("cases slower than torch (both settings)",
                 f"{slower} of {len(default) + len(faultfree)}"))
    lines = ["| target | met |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
    # ranges per op and dtype, fault-free: cynorm % STREAM / torch/cynorm
    lines += ["", "| op | dtype | cynorm % STREAM | torch/cynorm |", "|---|---|---|---|"]
    for op in OPS:
        for dtype in sorted({r["dtype"] for r in faultfree}):
            sel = [r for r in faultfree if r["op"] == op and r["dtype"] == dtype]
            if not sel:
                continue
            shares = [100 * stream_share(r, stream) for r in sel]
            ratios = [ratio(r) for r in sel]
            lines.append(f"| {LABEL[op]} | {dtype} | {min(shares):.0f}–{max(shares):.0f} % | "
                         f"{min(ratios):.2f}–{max(ratios):.2f}x |")
    return "\n".join(lines)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "results",
                                                               "norms_latest.json")
    with open(path) as f:
        print(tally(json.load(f)))


if __name__ == "__main__":
    main()
