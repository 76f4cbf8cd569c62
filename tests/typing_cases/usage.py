"""Typical use of cynorm, as a user writes it: mypy must accept it with the
types asserted here (tests/test_typing.py), and it runs."""
from typing import Any, Optional

import numpy as np
from numpy.typing import NDArray
from typing_extensions import assert_type

import cynorm
import cudnn_bind
from cynorm import nested

rng = np.random.default_rng(0)
v = rng.standard_normal((8, 4)).astype(np.float32)
g = np.ones((8, 1), np.float32)

w = cynorm.weight_norm(v, g, 0)
assert_type(w, NDArray[Any])
w2, norm = cynorm.weight_norm_interface(v, g, dim=0)
assert_type(norm, NDArray[Any])
grad_v, grad_g = cynorm.weight_norm_backward(np.ones_like(v), v, g, norm, 0)
w3 = cynorm.weight_norm(v, g, 0, out=np.empty_like(v))
n2: NDArray[Any] = cynorm.norm_except_dim(v, 2, None)
n_inf = cynorm.norm_except_dim(v, np.inf, -1, out=(None,))

x = rng.standard_normal((6, 16))
y, mean, rstd = cynorm.layer_norm(x, 16, np.ones(16), np.zeros(16), eps=1e-6)
gx, gw, gb = cynorm.layer_norm_backward(np.ones_like(x), x, (16,), mean, rstd, np.ones(16),
                                        output_mask=(True, True, False))
assert_type(gb, Optional[NDArray[Any]])
assert gb is None and gx is not None
gx.sum()            # narrowed by the check above

xb = rng.standard_normal((4, 3, 5, 5))
running_mean, running_var = np.zeros(3), np.ones(3)
yb, save_mean, save_invstd = cynorm.batch_norm(xb, np.ones(3), np.zeros(3), running_mean,
                                               running_var, True, 0.1, 1e-5)
grads = cynorm.batch_norm_backward(np.ones_like(xb), xb, np.ones(3), running_mean, running_var,
                                   save_mean, save_invstd, True)
mean_b, invstd_b = cynorm.batch_norm_stats(xb, 1e-5)
ye = cynorm.batch_norm_elemt(xb, np.ones(3), np.zeros(3), mean_b, invstd_b, 1e-5)

p = cynorm.softmax(x, 1)
lp = cynorm.log_softmax(x, -1)
gp: NDArray[Any] = cynorm.softmax_backward_data(np.ones_like(p), p, 1, p.dtype)
loss, total = cynorm.nll_loss_forward(lp, np.array([0, 1, 2, 3, 4, 5]), None, "sum")
loss_only = cynorm.nll_loss(lp, [0, 1, 2, 3, 4, 5], reduction="mean")
t = cynorm.trace(np.eye(3))

outs, tangents = cynorm.jvp(cynorm.layer_norm, (x, (16,)), (np.ones_like(x), None))
threads: int = cynorm.get_num_threads()
cynorm.set_num_threads(threads)
info: dict[str, int] = cynorm.alloc_cache_info()
cfg = cynorm.config()
assert_type(cfg, dict[str, Any])

nx = nested.nested_array([rng.standard_normal((2, 4)), rng.standard_normal((3, 4))])
assert_type(nx, nested.NestedArray)
nl = nested.layer_norm(nx, (4,))
total_sum = nested.sum(nx)
lengths = [nx.component_shape(i) for i in range(len(nx))]

available: bool = cudnn_bind.is_available()
reason: Optional[str] = cudnn_bind.unavailable_reason()
