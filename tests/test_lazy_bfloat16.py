"""cynorm imports ml_dtypes only when bfloat16 is met (its import costs most
of a second with ml_dtypes 0.7): `import cynorm` leaves it out, and a
bfloat16 array, tensor or dtype name met later registers the type on the
spot, on every route an array takes into the kernels.  Each case runs in a
fresh interpreter, since this suite's own modules import ml_dtypes."""
import subprocess
import sys
import textwrap

import pytest


def _run(body):
    """Run body after `import numpy as np, cynorm` in a fresh interpreter
    (the cynorm this suite imports); fail with its output if it fails."""
    code = "import sys\nimport numpy as np\nimport cynorm\n" + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_import_leaves_ml_dtypes_out():
    out = _run("""
        assert "ml_dtypes" not in sys.modules
        y, mean, rstd = cynorm.layer_norm(np.ones((2, 8), np.float32), (8,))
        cynorm.group_norm(np.ones((2, 4, 3), np.float64), 2)
        assert "ml_dtypes" not in sys.modules
        print(cynorm.config()["dtypes"])
    """)
    assert out.split() == ["float32,", "float64,", "bfloat16,", "float16"]


def test_arrays_made_after_import_take_every_route():
    # the plain (Cython) route, the Python layer's (a strided input), the
    # nested ops and forward mode: each first call registers bfloat16 and
    # gives the bits the fast route gives afterwards
    _run("""
        import ml_dtypes
        from cynorm import reference as ref
        rng = np.random.default_rng(0)
        x = rng.standard_normal((6, 16)).astype(ml_dtypes.bfloat16)
        assert cynorm._dtypes.BFLOAT16 is None
        y1 = cynorm.layer_norm(x, (16,))[0]
        assert cynorm._dtypes.BFLOAT16 == x.dtype
        y2 = cynorm.layer_norm(x, (16,))[0]
        assert y1.dtype == x.dtype and (y1.view(np.uint16) == y2.view(np.uint16)).all()
        want = ref.layer_norm(x.astype(np.float64), (16,))[0]
        assert np.abs(y1.astype(np.float64) - want).max() < 2e-2
    """)
    _run("""
        import ml_dtypes
        x = np.random.default_rng(1).standard_normal((4, 6, 8)).astype(ml_dtypes.bfloat16)
        strided = x[:, ::2]                        # not contiguous: the Python layer
        y1 = cynorm.group_norm(strided, 3)[0]
        y2 = cynorm.group_norm(np.ascontiguousarray(strided), 3)[0]
        assert y1.dtype == x.dtype and (y1.view(np.uint16) == y2.view(np.uint16)).all()
    """)
    _run("""
        import ml_dtypes
        from cynorm import nested
        b = np.arange(12, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(6, 2)
        nt = nested.nested_array([b[:2], b[2:]])
        assert nt.dtype == b.dtype
        assert nested.layer_norm(nt, (2,))[0].dtype == b.dtype
    """)
    _run("""
        import ml_dtypes
        x = np.random.default_rng(2).standard_normal((3, 8)).astype(ml_dtypes.bfloat16)
        t = np.ones_like(x)
        primal, tangent = cynorm.jvp(cynorm.rms_norm, (x, (8,)), (t, None))
        assert primal[0].dtype == x.dtype
    """)


def test_the_dtype_name_imports_ml_dtypes():
    # a dtype argument named "bfloat16" before anyone imported ml_dtypes
    _run("""
        assert "ml_dtypes" not in sys.modules
        y = np.full((2, 5), 0.2, np.float32)
        g = cynorm.softmax_backward_data(np.ones((2, 5), np.float32), y, 1, "bfloat16")
        assert "ml_dtypes" in sys.modules and g.dtype == cynorm._dtypes.BFLOAT16
    """)
    _run("""
        nt = cynorm.nested.nested_array([np.ones((2, 3)), np.ones((1, 3))], dtype="bfloat16")
        assert nt.dtype == cynorm._dtypes.BFLOAT16
    """)


def test_bfloat16_tensors_through_dlpack_and_the_torch_adapter():
    pytest.importorskip("torch")
    _run("""
        import torch
        import cynorm.torch as ct
        assert "ml_dtypes" not in sys.modules
        x = torch.randn(4, 16).to(torch.bfloat16)
        y = cynorm.layer_norm(x, (16,))[0]         # DLPack: registers bfloat16
        assert y.dtype == cynorm._dtypes.BFLOAT16
        want = torch.nn.functional.layer_norm(x.float(), (16,))
        assert (torch.from_numpy(y.astype(np.float32)) - want).abs().max() < 2e-2
        ln = ct.LayerNorm(16).to(torch.bfloat16)
        assert ln(x).dtype == torch.bfloat16
    """)
