# The kernel test files: the files that test the compiled kernels' results
# (the 16-bit conversions; every norm's forward and backward against the
# float64 reference and bit for bit across thread counts: layer, RMS,
# residual-fused, batch with its split-statistics ops, group and instance,
# weight; softmax / NLL / trace / log_sigmoid; extreme magnitudes and large
# means; out= aliasing and forms; the plain entries' out= and
# split-statistics calls; SIMD dispatch; the thread team, threads and the
# block cache; nested arrays; forward-mode rules; the Hypothesis property
# tests).  Sourced by .ci/aarch64 (under
# qemu), .ci/clang and .ci/run (the wheel at its lower SIMD levels), whose
# builds or levels change the compiled code only: the fuzz and stress runs,
# the adapters, packaging, typing, docs, source and import checks and
# argument validation run in .ci/run's suite (and which plain entry a call
# takes, test_plain_calls.py, over the kernels these test, there and in
# .ci/clang).
KERNEL_TESTS=(test_batch_norm.py test_layer_norm.py test_add_norms.py
    test_convert.py test_extreme_magnitudes.py test_large_mean_accuracy.py
    test_out_aliasing.py test_out_forms.py test_nested.py test_nested_batch_ops.py
    test_weight_norm.py test_rms_norm.py test_group_norm.py test_small_op_kernels.py
    test_plain_split_stats.py test_simd_dispatch.py test_alloc.py test_plain_out.py
    test_norm_properties.py test_threads.py test_threads_by_work.py test_team_policy.py
    test_jvp.py test_properties.py)
