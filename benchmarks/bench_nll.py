"""NLL losses on large inputs: cynorm and its PyTorch twin, interleaved.

    python benchmarks/bench_nll.py                  # 1 thread, 25 calls each
    python benchmarks/bench_nll.py --threads 2 --calls 50

float32 log-probabilities, class weights, every 50th target (every 7th
pixel row) ignored: nll_loss_forward / nll_loss_backward on (8192, 1000) and
the 2d forms on (8, 21, 128, 128).  The median of `--calls` calls in ms, and
torch/cynorm (above 1: cynorm is faster).  (bench_overhead.py times the same
ops on tiny inputs.)
"""
import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import time_interleaved  # noqa: E402


def cases(cn, torch):
    """(name, cynorm callable, torch callable)."""
    aten = torch.ops.aten
    rng = np.random.default_rng(0)
    T = torch.from_numpy
    x = cn.log_softmax(rng.standard_normal((8192, 1000), np.float32), 1)
    t = rng.integers(0, 1000, 8192)
    t[::50] = -100
    w = (rng.random(1000) + 0.5).astype(np.float32)
    _, tw = cn.nll_loss_forward(x, t, w, "mean")
    g = np.ones((), np.float32)
    tx, tt, tw_, ttw, tg = T(x), T(t), T(w), T(tw.copy()), torch.tensor(1.0)

    x4 = cn.log_softmax(rng.standard_normal((8, 21, 128, 128), np.float32), 1)
    t4 = rng.integers(0, 21, (8, 128, 128))
    t4[:, ::7] = -100
    w4 = (rng.random(21) + 0.5).astype(np.float32)
    _, tw4 = cn.nll_loss2d_forward(x4, t4, w4, "mean")
    g4 = rng.standard_normal((8, 128, 128)).astype(np.float32)
    tx4, tt4, tw4_, ttw4, tg4 = T(x4), T(t4), T(w4), T(tw4.copy()), T(g4)
    return [
        ("nll_loss_forward (8192, 1000) mean", lambda: cn.nll_loss_forward(x, t, w, "mean"),
         lambda: aten.nll_loss_forward(tx, tt, tw_, 1, -100)),
        ("nll_loss_backward (8192, 1000) mean", lambda: cn.nll_loss_backward(g, x, t, w, "mean", -100, tw),
         lambda: aten.nll_loss_backward(tg, tx, tt, tw_, 1, -100, ttw)),
        ("nll_loss2d_forward (8, 21, 128, 128) mean", lambda: cn.nll_loss2d_forward(x4, t4, w4, "mean"),
         lambda: aten.nll_loss2d_forward(tx4, tt4, tw4_, 1, -100)),
        ("nll_loss2d_forward (8, 21, 128, 128) none", lambda: cn.nll_loss2d_forward(x4, t4, w4, "none"),
         lambda: aten.nll_loss2d_forward(tx4, tt4, tw4_, 0, -100)),
        ("nll_loss2d_backward (8, 21, 128, 128) mean",
         lambda: cn.nll_loss2d_backward(g, x4, t4, w4, "mean", -100, tw4),
         lambda: aten.nll_loss2d_backward(tg, tx4, tt4, tw4_, 1, -100, ttw4)),
        ("nll_loss2d_backward (8, 21, 128, 128) none",
         lambda: cn.nll_loss2d_backward(g4, x4, t4, w4, "none", -100, tw4),
         lambda: aten.nll_loss2d_backward(tg4, tx4, tt4, tw4_, 0, -100, ttw4)),
    ]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--calls", type=int, default=25, help="calls per op and library (default 25)")
    args = p.parse_args()
    import torch

    import cynorm as cn
    cn.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    print(f"cynorm {cn.__version__}, torch {torch.__version__}; {args.threads} thread(s), "
          f"median of {args.calls} interleaved calls\n")
    print("| case | cynorm ms | torch ms | torch/cynorm |\n|---|---|---|---|")
    for name, fc, ft in cases(cn, torch):
        s = time_interleaved({"cynorm": fc, "torch": ft}, args.calls)
        c, t = statistics.median(s["cynorm"]) * 1e3, statistics.median(s["torch"]) * 1e3
        print(f"| {name} | {c:.3f} | {t:.3f} | {t / c:.2f} |", flush=True)


if __name__ == "__main__":
    main()
