# The settings every kernel module reads: the output size from which
# outputs are written with streaming stores (set_stream_min_bytes), the
# memory traffic from which a call runs on more than one thread (each kernel
# family's own threshold, set_family_min_bytes, unless set_parallel_min_bytes
# sets one for all), and the thread count of the calling thread
# (set_num_threads).

cdef enum:
    # The kernel families, each with its own threshold of memory traffic
    # (bytes read and written over all of a call's passes) from which a
    # second thread pays; below it waking the team costs more than it saves.
    # _runtime.FAMILIES names them in this order.
    FAMILY_ROWS = 0             # row reductions + a pass: layer norm, weight norm rows
    FAMILY_ELEMENTWISE = 1      # one elementwise pass: batch norm's normalize, grad input
    FAMILY_CHANNELS = 2         # batch norm's channel statistics (+ the pass)
    FAMILY_ROW_GRADS = 3        # layer norm's backward: rows, then column sums
    FAMILY_COLUMNS = 4          # weight norm's column norms: blocks, merge, pass
    FAMILY_EXP = 5              # exp-bound: softmax, log_sigmoid, gelu/silu
    N_FAMILIES = 6

cdef Py_ssize_t stream_min_bytes() noexcept nogil
cdef Py_ssize_t team_min_bytes(int family) noexcept nogil
cdef int max_threads() noexcept nogil

from libc.stdint cimport int64_t

cdef extern from "cn_team.h":
    # Thread teams that give way under load: the process's state, which
    # every kernel module binds to at import (entry.pxd's bind_team)
    ctypedef struct cn_team_state:
        int64_t held_until
        int64_t hold_ns
        int64_t worker_delay_ns
        int64_t regions
        int64_t late_regions
        int64_t last_late
        int cap
        int probe_woke
        int adaptive
    int64_t CN_TEAM_HOLD_MIN_NS
    void cn_team_bind(cn_team_state* state) noexcept nogil
    int cn_team_threads(int n) noexcept nogil
    int cn_team_wrapped() noexcept nogil

cdef cn_team_state* team_state() noexcept nogil
