"""cudnn_bind against torch.nn.functional.batch_norm on a GPU, per call: host
time (the Python call, nothing waited for) and device time (CUDA events
around back-to-back calls), for training forward, backward and inference on
ResNet-like shapes, float32 N,C,H,W and float16 channels-last, with PyTorch
CUDA tensors as inputs for both (so the same memory and streams); and
cudnn_bind's host time again with DeviceArray views of the same memory
(outputs from the binding's pool instead of PyTorch's allocator).

    python benchmarks/bench_cudnn_gpu.py                  # needs a GPU, torch with CUDA
    python benchmarks/bench_cudnn_gpu.py --calls 200 --json out.json --markdown table.md

--markdown writes the table alone, under a line naming the GPU and the
versions, ready to paste into benchmarks/README.md (.ci/gpu_run does).

torch's batch_norm on these inputs is cuDNN's kernel too (PyTorch routes
4-D CUDA batch norm there), so device times should agree and the host
columns compare the two bindings.  Median of `--repeats` samples of
`--calls` calls each.
"""
import argparse
import json
import statistics
import sys
import time


def markdown_table(rows):
    """The rows as a Markdown table; host and device time side by side with
    torch's, and cudnn_bind's host time as a multiple of torch's."""
    lines = ["| shape | dtype | layout | call | cudnn_bind host µs | torch host µs | host ratio | "
             "cudnn_bind device µs | torch device µs | cudnn_bind host µs, DeviceArray |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        shape = "×".join(str(d) for d in r["shape"])
        if "error" in r:
            message = r["error"].replace("|", "/").replace("\n", " ")
            lines.append(f"| {shape} | {r['dtype']} | {r['layout']} | {r['call']} | failed: "
                         f"{message} | | | | | |")
            continue
        lines.append(f"| {shape} | {r['dtype']} | {r['layout']} | {r['call']} | "
                     f"{r['host_us']:.1f} | {r['torch_host_us']:.1f} | "
                     f"{r['host_us'] / r['torch_host_us']:.2f} | {r['device_us']:.1f} | "
                     f"{r['torch_device_us']:.1f} | {r['devarr_host_us']:.1f} |")
    return "\n".join(lines)


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
    for shape, dtype, layout in [((32, 64, 56, 56), torch.float32, "nchw"),
                                 ((32, 256, 14, 14), torch.float32, "nchw"),
                                 ((8, 64, 14, 14), torch.float32, "nchw"),
                                 ((2, 4, 1, 1), torch.float32, "nchw"),
                                 ((32, 64, 56, 56), torch.float16, "nhwc"),
                                 ((32, 256, 14, 14), torch.float16, "nhwc")]:
        x = torch.randn(shape, device=dev, dtype=dtype)
        if layout == "nhwc":
            x = x.to(memory_format=torch.channels_last)
        c = shape[1]
        w, b = torch.randn(c, device=dev), torch.randn(c, device=dev)
        rm, rv = torch.zeros(c, device=dev), torch.ones(c, device=dev)
        dy = torch.randn_like(x)
        y, sm, si, reserve = cudnn_bind.batch_norm_forward_training(x, w, b, rm, rv)
        # the same memory as DeviceArrays, produced on torch's stream
        cur = torch.cuda.current_stream().cuda_stream
        dx, ddy, dw, db, drm, drv = (
            cudnn_bind.DeviceArray.from_pointer(t.data_ptr(), tuple(t.shape), t.dtype,
                                                t.stride(), t, stream=cur)
            for t in (x, dy, w, b, rm, rv))
        _, dsm, dsi, dreserve = cudnn_bind.batch_norm_forward_training(dx, dw, db, drm, drv)
        xt = x.detach().requires_grad_()
        wt, bt = w.detach().requires_grad_(), b.detach().requires_grad_()
        cases = {
            "training forward": (
                lambda: cudnn_bind.batch_norm_forward_training(x, w, b, rm, rv),
                lambda: cudnn_bind.batch_norm_forward_training(dx, dw, db, drm, drv),
                lambda: F.batch_norm(x, rm, rv, w, b, training=True)),
            "backward": (
                lambda: cudnn_bind.batch_norm_backward(x, dy, w, sm, si, 1e-5, reserve),
                lambda: cudnn_bind.batch_norm_backward(dx, ddy, dw, dsm, dsi, 1e-5, dreserve),
                lambda: torch.ops.aten.cudnn_batch_norm_backward(
                    x, dy, w, rm, rv, sm, si, 1e-5, reserve)),
            "inference": (
                lambda: cudnn_bind.batch_norm_forward_inference(x, w, b, rm, rv),
                lambda: cudnn_bind.batch_norm_forward_inference(dx, dw, db, drm, drv),
                lambda: F.batch_norm(x, rm, rv, w, b, training=False)),
        }
        del xt, wt, bt
        for name, (ours, ours_devarr, theirs) in cases.items():
            try:
                h1, d1 = timed(ours)
                h2, d2 = timed(theirs)
                h3, _ = timed(ours_devarr)
            except Exception as exc:  # noqa: BLE001 - a row says what failed
                rows.append({"shape": shape, "dtype": str(dtype).replace("torch.", ""),
                             "layout": layout, "call": name,
                             "error": f"{type(exc).__name__}: {exc}"})
                continue
            rows.append({"shape": shape, "dtype": str(dtype).replace("torch.", ""),
                         "layout": layout, "call": name, "host_us": h1, "device_us": d1,
                         "torch_host_us": h2, "torch_device_us": d2, "devarr_host_us": h3})
    table = markdown_table(rows)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(f"{title}:\n\n{table}\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main()
