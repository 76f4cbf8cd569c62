/* cynorm's norms on raw buffers, for callers outside Python: cynorm's
 * compiled PyTorch operators (cynorm/_torch_ops.cpp).  Each kernel module
 * hands out the address of its table (layer_norm.native_abi(): the row
 * norms; batch_norm.native_abi(): the channel norms); a caller checks the
 * version before it calls anything.  The results are the bits cynorm's
 * NumPy functions give for the same arguments. */
#ifndef CN_NATIVE_ABI_H
#define CN_NATIVE_ABI_H

#include <stddef.h>

#define CN_NATIVE_ABI_VERSION 2

/* storage codes (cynorm/_kernels/_plain.pxd.tp) */
enum { CN_NATIVE_F32 = 0, CN_NATIVE_F64 = 1, CN_NATIVE_BF16 = 2, CN_NATIVE_F16 = 3 };

/* The row norms (layer norm, RMS norm, each with or without the residual
 * add).  Buffers are C-contiguous: x, res, y, h, dh, gx hold M rows of N
 * values of `storage`; mean and rstd M values of its math type (float64
 * for float64, else float32).  Parameters (N values) are of the math type
 * or, for 16-bit storage, of x's own; NULL for none. */
typedef struct {
    int version;
    /* y = norm(x) (res non-NULL: h = x + res, y = norm(h)); centered: layer
     * norm (mean written), else RMS norm (mean NULL, b NULL).  Returns 0, or
     * -1 if a workspace could not be allocated. */
    int (*rows_forward)(int storage, const void* x, const void* res,
                        const void* w, int w_storage, const void* b, int b_storage,
                        void* y, void* h, void* mean, void* rstd,
                        ptrdiff_t M, ptrdiff_t N, double eps, int centered);
    /* gx (NULL: not computed) from dy, whose row i starts dy_rows[i]
     * elements into dy (dy_rows NULL: rows in order), plus dh where non-NULL;
     * gw, gb (NULL: not computed) the column sums, rounded into their
     * storage.  mean NULL: RMS norm.  Returns 0, or -1 as rows_forward. */
    int (*rows_backward)(int storage, const void* dy, const ptrdiff_t* dy_rows,
                         const void* dh, const void* x, const void* mean,
                         const void* rstd, const void* w, int w_storage, void* gx,
                         void* gw, int gw_storage, void* gb, int gb_storage,
                         ptrdiff_t M, ptrdiff_t N);
} cn_native_abi;

/* The channel norms: batch norm, and group norm (instance norm: G = C).
 * Batch norm's x, y, dy, gx: A * C * B values of `storage`, C-contiguous
 * as (A, C, B): C channels, A the axes before them, B those after (a
 * channels-last tensor: A = N * H * W, B = 1).  Per-channel vectors (C
 * values) are of the math type or, for 16-bit storage, of x's own; NULL
 * for none. */
typedef struct {
    int version;
    /* y; in training (train non-zero) save_mean and save_invstd (C values
     * of the math type) and the running statistics rm, rv (NULL: none),
     * updated in place.  Needs A * B > 0.  Returns 0, or -1 if a workspace
     * could not be allocated. */
    int (*channels_forward)(int storage, const void* x, void* y, const void* w, int w_storage,
                            const void* b, int b_storage, void* rm, int rm_storage, void* rv,
                            int rv_storage, void* save_mean, void* save_invstd, ptrdiff_t A,
                            ptrdiff_t C, ptrdiff_t B, int train, double momentum, double eps);
    /* gx (NULL: not computed); gw, gb (NULL: not computed) the sums,
     * rounded into their storage.  first, second: save_mean and
     * save_invstd (training) or the running mean and variance, C values of
     * any storage.  Returns 0, or -1 as channels_forward. */
    int (*channels_backward)(int storage, const void* dy, const void* x, void* gx,
                             const void* w, int w_storage, const void* first, int first_storage,
                             const void* second, int second_storage, void* gw, int gw_storage,
                             void* gb, int gb_storage, ptrdiff_t A, ptrdiff_t C, ptrdiff_t B,
                             int train, double eps);
    /* Group norm over G groups of C / G channels: x, y, dy, gx hold N * C
     * * HW values, as (N, C, HW) or, last non-zero, (N, HW, C); mean and
     * rstd N * G values of the math type, written by the forward (N * C *
     * HW > 0).  gx, gw, gb as channels_backward's (gw, gb in their
     * storage); fixed: statistics that do not depend on x.  Returns 0, or
     * -1 as channels_forward. */
    int (*groups_forward)(int storage, const void* x, void* y, const void* w, int w_storage,
                          const void* b, int b_storage, void* mean, void* rstd, ptrdiff_t N,
                          ptrdiff_t C, ptrdiff_t HW, ptrdiff_t G, double eps, int last);
    int (*groups_backward)(int storage, const void* dy, const void* x, void* gx,
                           const void* mean, const void* rstd, const void* w, int w_storage,
                           void* gw, int gw_storage, void* gb, int gb_storage, ptrdiff_t N,
                           ptrdiff_t C, ptrdiff_t HW, ptrdiff_t G, int last, int fixed);
} cn_native_channels_abi;

#endif
