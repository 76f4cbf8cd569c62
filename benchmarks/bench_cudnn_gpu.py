"""cudnn_bind against PyTorch on a GPU, per call: host time (the Python call,
nothing waited for) and device time (CUDA events around back-to-back calls).

Batch norm (training forward, backward, inference; ResNet-like shapes,
float32 N,C,H,W, float16 and bfloat16 channels-last) against
torch.nn.functional.batch_norm, twice: with ``backend="auto"`` (the row
names the API it chose: "graph" or "legacy") and with ``backend="legacy"``.
Layer norm and RMSNorm (graph API) against PyTorch's own CUDA kernels.
Inputs are PyTorch CUDA tensors for both sides (the same memory and
streams); the last column is cudnn_bind's host time again with DeviceArray
views of the same memory (outputs from the binding's pool instead of
PyTorch's allocator).

    python benchmarks/bench_cudnn_gpu.py                  # needs a GPU, torch with CUDA
    python benchmarks/bench_cudnn_gpu.py --calls 200 --json out.json --markdown table.md

--markdown writes the tables alone, in benchmarks/README.md's layout (batch
norm's cells auto / legacy, layer norm's and RMSNorm's forward / backward),
under a line naming the GPU and the versions, ready to paste
(.ci/gpu_run does).
Median of `--repeats` samples of `--calls` calls each.
"""
import argparse
import json
import statistics
import sys
import time


COLUMNS = ("cudnn_bind host µs | torch host µs | host ratio | cudnn_bind device µs | "
           "torch device µs | device ratio")


def _cells(pair):
    """The timing cells of a group of rows (a group of one or two: batch
    norm's auto and legacy runs, or an op's forward and backward), each
    cell "first / second"; a row that failed reads "failed"."""
    def num(r, key):
        if r is not None and "error" in r:
            return "failed"
        return f"{r[key]:.1f}" if r is not None and key in r else "—"

    def ratio(r, a, b):
        if r is not None and "error" in r:
            return "failed"
        return f"{r[a] / r[b]:.2f}" if r is not None and a in r and b in r else "—"

    return [" / ".join(f(r) for r in pair)
            for f in (lambda r: num(r, "host_us"), lambda r: num(r, "torch_host_us"),
                      lambda r: ratio(r, "host_us", "torch_host_us"),
                      lambda r: num(r, "device_us"), lambda r: num(r, "torch_device_us"),
                      lambda r: ratio(r, "device_us", "torch_device_us"),
                      lambda r: num(r, "devarr_host_us"))]


def markdown_tables(rows):
    """The rows as benchmarks/README.md's two tables: batch norm, each call
    one row with cells `backend="auto"` / `backend="legacy"` and the API auto
    ran; layer norm and RMSNorm, each op one row with cells forward /
    backward.  Ratios are cudnn_bind/torch."""
    def key(r):
        return (tuple(r["shape"]), r["dtype"], r["layout"], r["call"])

    bn = ["| shape | dtype | layout | call | `auto` ran | " + COLUMNS
          + " | cudnn_bind host µs, DeviceArray |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rn = ["| shape | dtype | op | " + COLUMNS + " | cudnn_bind host µs, DeviceArray, forward |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    groups = {}
    for r in rows:
        if r["layout"] == "rows":       # "layer norm forward" -> ("layer norm", "forward")
            op, _, direction = r["call"].rpartition(" ")
            groups.setdefault((tuple(r["shape"]), r["dtype"], "rows", op), {})[direction] = r
        else:
            groups.setdefault(key(r), {})[r.get("asked", "auto")] = r
    for (shape, dtype, layout, call), g in groups.items():
        dims = "×".join(str(d) for d in shape)
        if layout == "rows":
            fwd = g.get("forward")
            cells = _cells((fwd, g.get("backward")))
            cells[-1] = _cells((fwd,))[-1]      # DeviceArray: the forward only
            rn.append(f"| {dims} | {dtype} | {call} | " + " | ".join(cells) + " |")
        else:
            auto = g.get("auto")
            ran = auto["backend"] if auto else "—"
            bn.append(f"| {dims} | {dtype} | {layout} | {call} | {ran} | "
                      + " | ".join(_cells((auto, g.get("legacy")))) + " |")
    failures = [f"- {'×'.join(str(d) for d in r['shape'])} {r['dtype']} {r['call']} "
                f"({r.get('asked', 'auto')}): " + r["error"].replace("\n", " ")[:300]
                for r in rows if "error" in r]
    return ("\n".join(bn) + "\n\nLayer norm and RMSNorm:\n\n" + "\n".join(rn)
            + ("\n\nFailed:\n\n" + "\n".join(failures) if failures else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None, help="also write the table to this file")
    args = ap.parse_args()

    import torch
    import cudnn_bind
    reason = cudnn_bind.unavailable_reason()
    if reason or not torch.cuda.is_available():
        sys.exit(f"no GPU for this benchmark: {reason or 'torch has no CUDA'}")
    F = torch.nn.functional
    dev = torch.device("cuda")
    title = (f"{torch.cuda.get_device_name(0)}; cuDNN {cudnn_bind.version()} (cudnn_bind), "
             f"torch {torch.__version__} with cuDNN {torch.backends.cudnn.version()}; median of "
             f"{args.repeats} samples of {args.calls} calls")
    print(f"# {title}")

    def timed(fn):
        """(host µs, device µs) per call."""
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        host, device = [], []
        for _ in range(args.repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t = time.perf_counter()
            start.record()
            for _ in range(args.calls):
                fn()
            end.record()
            host.append((time.perf_counter() - t) / args.calls * 1e6)
            end.synchronize()
            device.append(start.elapsed_time(end) / args.calls * 1e3)
        return statistics.median(host), statistics.median(device)

    rows = []

    def measure(shape, dtype, layout, name, backend, ours, theirs, ours_devarr=None,
                asked="auto"):
        # backend: the API the call ran on; asked: the backend= it was given
        row = {"shape": shape, "dtype": str(dtype).replace("torch.", ""), "layout": layout,
               "call": name, "backend": backend, "asked": asked}
        try:
            row["host_us"], row["device_us"] = timed(ours)
            if theirs is not None:
                row["torch_host_us"], row["torch_device_us"] = timed(theirs)
            if ours_devarr is not None:
                row["devarr_host_us"] = timed(ours_devarr)[0]
        except Exception as exc:  # noqa: BLE001 - a row says what failed
            row["error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)

    def devarr(t):
        cur = torch.cuda.current_stream().cuda_stream
        return cudnn_bind.DeviceArray.from_pointer(t.data_ptr(), tuple(t.shape), t.dtype,
                                                   t.stride(), t, stream=cur)

    for shape, dtype, layout in [((32, 64, 56, 56), torch.float32, "nchw"),
                                 ((32, 256, 14, 14), torch.float32, "nchw"),
                                 ((8, 64, 14, 14), torch.float32, "nchw"),
                                 ((2, 4, 1, 1), torch.float32, "nchw"),
                                 ((32, 64, 56, 56), torch.float16, "nhwc"),
                                 ((32, 256, 14, 14), torch.float16, "nhwc"),
                                 ((32, 64, 56, 56), torch.bfloat16, "nhwc")]:
        x = torch.randn(shape, device=dev, dtype=dtype)
        if layout == "nhwc":
            x = x.to(memory_format=torch.channels_last)
        c = shape[1]
        w, b = torch.randn(c, device=dev), torch.randn(c, device=dev)
        rm, rv = torch.zeros(c, device=dev), torch.ones(c, device=dev)
        dy = torch.randn_like(x)
        dx, ddy, dw, db, drm, drv = (devarr(t) for t in (x, dy, w, b, rm, rv))
        for backend in ("auto", "legacy"):
            used = backend
            if backend == "auto":
                try:
                    used = cudnn_bind.batch_norm_backend(x, True)[0]
                except Exception as exc:  # noqa: BLE001
                    used = f"auto ({type(exc).__name__})"
            bk = {"backend": backend}
            try:
                y, sm, si, reserve = cudnn_bind.batch_norm_forward_training(x, w, b, rm, rv, **bk)
                _, dsm, dsi, dreserve = cudnn_bind.batch_norm_forward_training(
                    dx, dw, db, drm, drv, **bk)
            except Exception as exc:  # noqa: BLE001
                rows.append({"shape": shape, "dtype": str(dtype).replace("torch.", ""),
                             "layout": layout, "call": "training forward", "backend": used,
                             "asked": backend, "error": f"{type(exc).__name__}: {exc}"})
                continue
            # torch's saved tensors for its backward: its own forward's
            # (y, save_mean, save_invstd, reserve): torch 2.11's cudnn_batch_norm
            tsm = tsi = treserve = None
            if dtype != torch.bfloat16:
                _, tsm, tsi, treserve = torch.ops.aten.cudnn_batch_norm(
                    x, w, b, rm, rv, True, 0.1, 1e-5)[:4]
            torch_bwd = None if tsm is None else (
                lambda: torch.ops.aten.cudnn_batch_norm_backward(
                    x, dy, w, rm, rv, tsm, tsi, 1e-5, treserve))
            measure(shape, dtype, layout, "training forward", used,
                    lambda: cudnn_bind.batch_norm_forward_training(x, w, b, rm, rv, **bk),
                    lambda: F.batch_norm(x, rm, rv, w, b, training=True),
                    lambda: cudnn_bind.batch_norm_forward_training(dx, dw, db, drm, drv, **bk),
                    backend)
            measure(shape, dtype, layout, "backward", used,
                    lambda: cudnn_bind.batch_norm_backward(x, dy, w, sm, si, 1e-5, reserve, **bk),
                    torch_bwd,
                    lambda: cudnn_bind.batch_norm_backward(dx, ddy, dw, dsm, dsi, 1e-5,
                                                           dreserve, **bk),
                    backend)
            used_inf = used
            if backend == "auto":
                try:
                    used_inf = cudnn_bind.batch_norm_backend(x, False)[0]
                except Exception as exc:  # noqa: BLE001
                    used_inf = f"auto ({type(exc).__name__})"
            measure(shape, dtype, layout, "inference", used_inf,
                    lambda: cudnn_bind.batch_norm_forward_inference(x, w, b, rm, rv, **bk),
                    lambda: F.batch_norm(x, rm, rv, w, b, training=False),
                    lambda: cudnn_bind.batch_norm_forward_inference(dx, dw, db, drm, drv, **bk),
                    backend)

    # layer norm and RMSNorm: torch's CUDA kernels (not cuDNN) are the peer
    for (rows_, cols), dtype in [((32, 768), torch.float32), ((32, 768), torch.bfloat16),
                                 ((8192, 1024), torch.float32), ((4096, 4096), torch.bfloat16),
                                 ((16384, 4096), torch.bfloat16)]:
        x = torch.randn(rows_, cols, device=dev, dtype=dtype)
        w, b = torch.randn(cols, device=dev, dtype=dtype), torch.randn(cols, device=dev, dtype=dtype)
        dy = torch.randn_like(x)
        dx_, ddy, dw_, db_ = (devarr(t) for t in (x, dy, w, b))
        shape = (rows_, cols)
        try:
            _, mean, rstd = cudnn_bind.layer_norm_forward(x, cols, w, b)
            _, inv = cudnn_bind.rms_norm_forward(x, cols, w, 1e-6)
        except Exception as exc:  # noqa: BLE001
            rows.append({"shape": shape, "dtype": str(dtype).replace("torch.", ""),
                         "layout": "rows", "call": "layer norm forward", "backend": "graph",
                         "error": f"{type(exc).__name__}: {exc}"})
            continue
        _, tmean, trstd = torch.ops.aten.native_layer_norm(x, (cols,), w, b, 1e-5)
        measure(shape, dtype, "rows", "layer norm forward", "graph",
                lambda: cudnn_bind.layer_norm_forward(x, cols, w, b),
                lambda: torch.ops.aten.native_layer_norm(x, (cols,), w, b, 1e-5),
                lambda: cudnn_bind.layer_norm_forward(dx_, cols, dw_, db_))
        measure(shape, dtype, "rows", "layer norm backward", "graph",
                lambda: cudnn_bind.layer_norm_backward(dy, x, cols, mean, rstd, w),
                lambda: torch.ops.aten.native_layer_norm_backward(
                    dy, x, (cols,), tmean, trstd, w, b, [True, True, True]))
        measure(shape, dtype, "rows", "RMS norm forward", "graph",
                lambda: cudnn_bind.rms_norm_forward(x, cols, w, 1e-6),
                lambda: F.rms_norm(x, (cols,), w, 1e-6),
                lambda: cudnn_bind.rms_norm_forward(dx_, cols, dw_, 1e-6))
        measure(shape, dtype, "rows", "RMS norm backward", "graph",
                lambda: cudnn_bind.rms_norm_backward(dy, x, cols, inv, w), None)
    table = markdown_tables(rows)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(f"{title}:\n\n{table}\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main()
