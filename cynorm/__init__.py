"""cynorm: normalization kernels for NumPy arrays.

Cython + OpenMP kernels behind a NumPy API, with PyTorch's semantics:

* weight normalization: `weight_norm`, `weight_norm_interface`,
  `weight_norm_backward`, `norm_except_dim`
* layer normalization: `layer_norm`, `layer_norm_backward`
* RMS normalization: `rms_norm`, `rms_norm_backward`
* the residual add fused into either: `add_layer_norm`, `add_rms_norm` and
  their backward ops `add_layer_norm_backward`, `add_rms_norm_backward`
* group and instance normalization, channels first or last: `group_norm`,
  `group_norm_backward`, `instance_norm`, `instance_norm_backward`
* batch normalization: `batch_norm`, `batch_norm_backward`, and the
  split-statistics ops synchronized batch norm is built from:
  `batch_norm_stats`, `batch_norm_gather_stats`, `batch_norm_elemt`,
  `batch_norm_backward_reduce`, `batch_norm_backward_elemt`; ATen's other
  backward entry points `cudnn_batch_norm_backward`,
  `miopen_batch_norm_backward` and `aten.batch_norm_backward`
* forward-mode derivatives: `jvp(op, primals, tangents)`, `jvp_rules`,
  `register_jvp`, with rules for every op here
* nested (jagged) arrays and their ops: `cynorm.nested`
* synchronized batch norm across MPI processes: `cynorm.distributed`
  (`sync_batch_norm`, `sync_batch_norm_backward`; needs the mpi extra)
* the other ops of PyTorch's forward-mode decomposition table: `softmax`,
  `log_softmax`, `softmax_backward_data`, `log_softmax_backward_data`,
  `nll_loss`, `nll_loss2d`, `nll_loss_forward`, `nll_loss2d_forward`,
  `nll_loss_backward`, `nll_loss2d_backward`, `trace`, `log_sigmoid_forward`

Threads: `set_num_threads` / `get_num_threads` (OMP_NUM_THREADS and
threadpoolctl work too); where a call starts to use them: `tune_threads`,
`get_thread_thresholds`, `set_thread_thresholds`; how the team gives way
when other work holds the cores: `get_team_policy`, `set_team_policy`,
`thread_team_info`.  Build facts: `show_config()`.  Large outputs come
from a small cache of freed blocks: `alloc_cache_info`,
`set_alloc_cache_limit`, `clear_alloc_cache` (or CYNORM_ALLOC_CACHE=off).
"""
import pkgutil as _pkgutil

# Run from a source checkout (`python -m cynorm` in the repository root puts
# the checkout first on sys.path) this package has no compiled kernels; let
# its subpackages also look in the installed copy (pip install .), which has.
__path__ = _pkgutil.extend_path(__path__, __name__)

from cynorm._version import __version__  # noqa: E402
from cynorm._threads import (  # noqa: E402
    get_num_threads, get_team_policy, get_thread_thresholds, set_num_threads, set_team_policy,
    set_thread_thresholds, thread_team_info, tune_threads,
)
from cynorm._config import (  # noqa: E402
    alloc_cache_info, clear_alloc_cache, config, set_alloc_cache_limit, show_config,
)
from cynorm.layernorm import (  # noqa: E402
    add_layer_norm, add_layer_norm_backward, layer_norm, layer_norm_backward,
)
from cynorm.rmsnorm import (  # noqa: E402
    add_rms_norm, add_rms_norm_backward, rms_norm, rms_norm_backward,
)
from cynorm.batchnorm import batch_norm, batch_norm_backward  # noqa: E402
from cynorm.groupnorm import (  # noqa: E402
    group_norm, group_norm_backward, instance_norm, instance_norm_backward,
)
from cynorm.batchnorm_stats import (  # noqa: E402
    batch_norm_backward_elemt,
    batch_norm_backward_reduce,
    batch_norm_elemt,
    batch_norm_gather_stats,
    batch_norm_stats,
)
from cynorm.weightnorm import (  # noqa: E402
    norm_except_dim,
    weight_norm,
    weight_norm_backward,
    weight_norm_interface,
)
from cynorm.softmax_ops import (  # noqa: E402
    log_softmax,
    log_softmax_backward_data,
    softmax,
    softmax_backward_data,
)
from cynorm.nll_losses import (  # noqa: E402
    nll_loss,
    nll_loss2d,
    nll_loss2d_backward,
    nll_loss2d_forward,
    nll_loss_backward,
    nll_loss_forward,
)
from cynorm.pointwise import log_sigmoid_forward, trace  # noqa: E402
from cynorm import aten  # noqa: E402
from cynorm.aten import cudnn_batch_norm_backward, miopen_batch_norm_backward  # noqa: E402
from cynorm.forward_ad import jvp, jvp_rules, register_jvp  # noqa: E402
from cynorm import nested  # noqa: E402
from cynorm import distributed  # noqa: E402  (imports mpi4py only when used)

__all__ = [
    "__version__",
    "add_layer_norm",
    "add_layer_norm_backward",
    "add_rms_norm",
    "add_rms_norm_backward",
    "alloc_cache_info",
    "batch_norm",
    "batch_norm_backward",
    "batch_norm_backward_elemt",
    "batch_norm_backward_reduce",
    "batch_norm_elemt",
    "batch_norm_gather_stats",
    "batch_norm_stats",
    "aten",
    "cudnn_batch_norm_backward",
    "distributed",
    "instance_norm",
    "instance_norm_backward",
    "jvp",
    "jvp_rules",
    "log_sigmoid_forward",
    "log_softmax",
    "log_softmax_backward_data",
    "miopen_batch_norm_backward",
    "nested",
    "nll_loss",
    "nll_loss2d",
    "nll_loss2d_backward",
    "nll_loss2d_forward",
    "nll_loss_backward",
    "nll_loss_forward",
    "register_jvp",
    "rms_norm",
    "rms_norm_backward",
    "softmax",
    "softmax_backward_data",
    "trace",
    "tune_threads",
    "get_team_policy",
    "group_norm",
    "group_norm_backward",
    "set_team_policy",
    "thread_team_info",
    "clear_alloc_cache",
    "config",
    "get_num_threads",
    "get_thread_thresholds",
    "layer_norm",
    "layer_norm_backward",
    "norm_except_dim",
    "set_alloc_cache_limit",
    "set_num_threads",
    "set_thread_thresholds",
    "show_config",
    "weight_norm",
    "weight_norm_backward",
    "weight_norm_interface",
]
