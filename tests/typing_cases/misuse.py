"""Calls a type checker must refuse (tests/test_typing.py): each line that
ends with the marker comment is one mypy reports, and no other is.  (Never
run: most of these raise at run time too.)"""
import numpy as np

import cynorm
import cudnn_bind
from cynorm import nested

v = np.ones((8, 4), np.float32)
g = np.ones((8, 1), np.float32)

cynorm.weight_norm(v, g, dim="0")  # mypy: error
cynorm.weight_norm(v, g, 0, (v,), None)  # mypy: error
w, norm, extra = cynorm.weight_norm_interface(v, g)  # mypy: error
cynorm.layer_norm(v, (4,), eps="small")  # mypy: error
y: int = cynorm.softmax(v, 0)  # mypy: error
cynorm.set_num_threads(2.5)  # mypy: error
cynorm.layer_norm_backward(v, v, 4, v, v)[0].sum()  # mypy: error
cynorm.batch_norm(v, training="yes")  # mypy: error
cynorm.nll_loss(v, [0] * 8, reduction=None)  # mypy: error
cynorm.jvp(cynorm.softmax, (v, 0), v)  # mypy: error
nested.sum(v)  # mypy: error
nested.nested_array([v]).to_padded(fill="zero")  # mypy: error
count: str = cudnn_bind.device_count()  # mypy: error
