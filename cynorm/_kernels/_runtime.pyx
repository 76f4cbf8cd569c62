# cython: language_level=3
"""OpenMP thread control, the streaming-store and thread-team thresholds
every kernel module reads, and the facts of this build (compiler, SIMD,
OpenMP)."""
import glob
import os
import time

cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    static int cn_get_max_threads(void) { return omp_get_max_threads(); }
    static void cn_set_num_threads(int n) { omp_set_num_threads(n); }
    static int cn_num_procs(void) { return omp_get_num_procs(); }
    #else
    static int cn_get_max_threads(void) { return 1; }
    static void cn_set_num_threads(int n) { (void)n; }
    static int cn_num_procs(void) { return 1; }
    #endif
    """
    int cn_get_max_threads() nogil
    void cn_set_num_threads(int n) nogil
    int cn_num_procs() nogil

cdef extern from "cn_cpu.h":
    int cn_cpu_level() nogil

from cynorm._kernels.common cimport CN_SIMD_LEVEL, CN_COMPILER, CN_F16_IMPL, CN_OPENMP


def cpu_level():
    """The highest x86-64 level this CPU runs: 5 (AVX-512 with AVX512-BF16),
    4 (AVX-512), 3 (AVX2) or 1."""
    return cn_cpu_level()


cdef int max_threads() noexcept nogil:
    return cn_get_max_threads()


def get_num_threads():
    return cn_get_max_threads()


def set_num_threads(int n):
    cn_set_num_threads(n)


def build_info():
    return {
        "compiler": CN_COMPILER.decode(),
        "simd": CN_SIMD_LEVEL.decode(),
        "float16_conversion": CN_F16_IMPL.decode(),
        "openmp": int(CN_OPENMP),
        "num_procs": cn_num_procs(),
    }


def last_level_cache_bytes():
    """Size of the largest CPU cache (Linux sysfs), or 0 when unknown."""
    sizes = []
    for index in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(os.path.join(index, "size")) as f:
                text = f.read().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=0)


def streaming_threshold():
    """The default of set_stream_min_bytes: 16 MiB, whatever the last-level
    cache.  From there a cached store's line read and write-back cost the op
    more than its consumer gains from finding the output in a large L3
    (benchmarks/MEASUREMENTS.md)."""
    return 16 << 20


cdef Py_ssize_t STREAM_MIN_BYTES = streaming_threshold()


cdef Py_ssize_t stream_min_bytes() noexcept nogil:
    return STREAM_MIN_BYTES


def set_stream_min_bytes(Py_ssize_t nbytes):
    """Kernel outputs of at least nbytes are written with streaming stores, in
    every kernel module and SIMD level; returns the old value.  (Tuning and
    tests: 0 streams every output, a huge value none.)"""
    global STREAM_MIN_BYTES
    old = STREAM_MIN_BYTES
    STREAM_MIN_BYTES = nbytes
    return old


# -1: each kernel family's own threshold (FAMILY_MIN_BYTES); >= 0: one for all
cdef Py_ssize_t PARALLEL_MIN_BYTES = -1


def set_parallel_min_bytes(nbytes):
    """Kernel calls that read and write at least nbytes (over all their
    passes) run on the thread team, smaller ones on one thread; None
    restores each kernel family's own threshold.  Returns
    the old value (None for the families' own).  For tuning and tests: 0
    wakes the team for every call."""
    global PARALLEL_MIN_BYTES
    old = None if PARALLEL_MIN_BYTES < 0 else PARALLEL_MIN_BYTES
    if nbytes is not None and nbytes < 0:
        raise ValueError(f"nbytes must be >= 0 or None, got {nbytes}")
    PARALLEL_MIN_BYTES = -1 if nbytes is None else nbytes
    return old


# Each kernel family's memory traffic (bytes read and written over all of a
# call's passes) from which a second thread pays, in _runtime.pxd's family
# order.  The defaults were measured with benchmarks/bench_threads.py on a
# Sapphire Rapids VM (benchmarks/README.md, "Threads by work"), where the
# team's wake-up cost 5-10 us; row_grads and columns are the AMD EPYC VMs'
# (Zen 3 and Zen 4: the same section).
# cynorm.tune_threads measures them on the machine at hand and sets them
# here.
FAMILIES = ("rows", "elementwise", "channels", "row_grads", "columns", "exp")
DEFAULT_FAMILY_MIN_BYTES = (512 << 10, 768 << 10, 1 << 20, 640 << 10, 768 << 10, 96 << 10)
cdef Py_ssize_t FAMILY_MIN_BYTES[N_FAMILIES]
for _i in range(N_FAMILIES):
    FAMILY_MIN_BYTES[_i] = DEFAULT_FAMILY_MIN_BYTES[_i]


cdef Py_ssize_t team_min_bytes(int family) noexcept nogil:
    """The traffic from which a call of this family wakes the team: the
    override of set_parallel_min_bytes when one is set, else the family's."""
    return PARALLEL_MIN_BYTES if PARALLEL_MIN_BYTES >= 0 else FAMILY_MIN_BYTES[family]


def get_family_min_bytes():
    """{family: bytes}: each kernel family's threshold now."""
    return {name: FAMILY_MIN_BYTES[i] for i, name in enumerate(FAMILIES)}


def set_family_min_bytes(Py_ssize_t family, Py_ssize_t nbytes):
    """Sets family's (an index into FAMILIES) threshold; returns the old one.
    The caller validates (cynorm.set_thread_thresholds)."""
    if not 0 <= family < N_FAMILIES or nbytes < 0:
        raise ValueError(f"family index 0..{N_FAMILIES - 1} and nbytes >= 0, got {family}, {nbytes}")
    old = FAMILY_MIN_BYTES[family]
    FAMILY_MIN_BYTES[family] = nbytes
    return old


# The thread-team state every kernel module binds to (cn_team.h): adaptive
# by default where the build can time its regions, unless
# CYNORM_TEAM_POLICY=fixed.
cdef cn_team_state TEAM
TEAM.held_until = 0
TEAM.hold_ns = CN_TEAM_HOLD_MIN_NS
TEAM.worker_delay_ns = 0
TEAM.regions = 0
TEAM.late_regions = 0
TEAM.last_late = 0
TEAM.cap = 0
TEAM.probe_woke = 0
TEAM.adaptive = cn_team_wrapped() and os.environ.get("CYNORM_TEAM_POLICY", "") != "fixed"
cn_team_bind(&TEAM)

TEAM_POLICIES = ("adaptive", "fixed")


cdef cn_team_state* team_state() noexcept nogil:
    return &TEAM


def team_adaptive_available():
    """Whether this build times its parallel regions (cn_team.h)."""
    return bool(cn_team_wrapped())


def get_team_policy():
    return "adaptive" if TEAM.adaptive else "fixed"


def set_team_policy(str policy):
    """'adaptive' or 'fixed' (validated by the caller); returns the old
    policy.  Either way the cap and hold start afresh."""
    old = get_team_policy()
    TEAM.adaptive = policy == "adaptive"
    reset_team()
    return old


def reset_team():
    """No cap, no hold, the shortest hold next; the counters stay."""
    TEAM.cap = 0
    TEAM.probe_woke = 0
    TEAM.held_until = 0
    TEAM.last_late = 0
    TEAM.hold_ns = CN_TEAM_HOLD_MIN_NS


def team_info():
    """The team state now (the caller documents it)."""
    held = max(0, TEAM.held_until - time.monotonic_ns()) if TEAM.cap else 0
    return {"policy": get_team_policy(), "cap": TEAM.cap, "held_for_s": held / 1e9,
            "regions": TEAM.regions, "late_regions": TEAM.late_regions}


def set_worker_delay_ns(int64_t ns):
    """Tests: each worker of a timed region sleeps ns before its share (a
    worker the OS scheduled late); returns the old value."""
    old = TEAM.worker_delay_ns
    TEAM.worker_delay_ns = ns
    return old
