/*
 * Host-memory stand-in for the slice of cuDNN 9 (legacy batch-norm API) and
 * of the CUDA runtime that cudnn_bind calls through ctypes.
 *
 * Why it exists: the test machines have no GPU and no NVIDIA driver, yet we
 * want to run the ctypes binding end to end.  This library exports the same
 * symbols as libcudnn / libcudart, computes on plain host memory ("device
 * pointers" are host pointers), and is compiled against the REAL cuDNN and
 * CUDA headers so that every definition below is checked by the compiler
 * against the real prototype.
 *
 * It is deliberately stricter than the real library where the real library
 * would crash or silently misbehave (NULL handles/descriptors, destroyed
 * descriptors, too-small workspace/reserve, reserve not produced by a
 * matching forward call, buffers running past the end of their cudaMalloc
 * block): those return an error status and record a detail string that
 * cudnnGetLastErrorString() hands back.  Test hooks (standin_*) expose call
 * counts, live allocations and the last workspace/reserve sizes.
 *
 * Numerics: everything is computed in double and rounded once on store
 * (round-to-nearest-even for float, half and bfloat16).
 */
#include <cudnn.h>
#include <cuda_runtime_api.h>

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Test hooks: not in any header; tests look them up by name via ctypes.     */
/* ------------------------------------------------------------------------ */

long standin_calls(const char *name);
void standin_reset(void);
size_t standin_take_log(char *buffer, size_t size);
void standin_fail_mallocs(long count);
long standin_live_allocations(void);
long standin_live_objects(const char *kind);
size_t standin_last_size(const char *what);

/* ------------------------------------------------------------------------ */
/* Bookkeeping shared by every entry point                                   */
/* ------------------------------------------------------------------------ */

/* One lock guards the call counters, the object registry and the
 * allocation table.  Computations run outside it: the contract (like
 * cuDNN's) is one thread at a time per handle. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

/* Every exported cuDNN / CUDA function, in one list, so the counters and
 * standin_calls() cannot drift from what is implemented. */
#define STANDIN_FUNCTIONS(X)                                                   \
    X(cudnnGetVersion) X(cudnnGetCudartVersion) X(cudnnGetErrorString)         \
    X(cudnnGetLastErrorString) X(cudnnCreate) X(cudnnDestroy)                  \
    X(cudnnSetStream) X(cudnnGetStream) X(cudnnCreateTensorDescriptor)         \
    X(cudnnSetTensorNdDescriptor) X(cudnnGetTensorNdDescriptor)                \
    X(cudnnDestroyTensorDescriptor) X(cudnnDeriveBNTensorDescriptor)           \
    X(cudnnCreateActivationDescriptor) X(cudnnSetActivationDescriptor)         \
    X(cudnnDestroyActivationDescriptor)                                        \
    X(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize)                \
    X(cudnnGetBatchNormalizationBackwardExWorkspaceSize)                       \
    X(cudnnGetBatchNormalizationTrainingExReserveSpaceSize)                    \
    X(cudnnBatchNormalizationForwardTrainingEx)                                \
    X(cudnnBatchNormalizationForwardInference)                                 \
    X(cudnnBatchNormalizationBackwardEx)                                       \
    X(cudaRuntimeGetVersion) X(cudaDriverGetVersion) X(cudaGetDeviceCount)     \
    X(cudaGetDevice) X(cudaSetDevice) X(cudaMalloc) X(cudaFree) X(cudaMemcpy)  \
    X(cudaMemset) X(cudaDeviceSynchronize) X(cudaStreamSynchronize)            \
    X(cudaPointerGetAttributes) X(cudaGetErrorString) X(cudaGetErrorName)      \
    X(cudaGetLastError) X(cudaMemcpyAsync) X(cudaEventCreateWithFlags)         \
    X(cudaEventRecord) X(cudaEventDestroy) X(cudaStreamWaitEvent)

#define AS_NAME(f) #f,
static const char *const g_fn_names[] = {STANDIN_FUNCTIONS(AS_NAME)};
#undef AS_NAME
#define N_FUNCS ((int)(sizeof g_fn_names / sizeof g_fn_names[0]))

static long g_fn_calls[N_FUNCS];
static size_t g_last_workspace, g_last_reserve;

static int fn_index(const char *name)
{
    for (int i = 0; i < N_FUNCS; i++)
        if (strcmp(g_fn_names[i], name) == 0)
            return i;
    return -1;
}

/* Called first thing by every exported function, with __func__. */
static void count_call(const char *fn)
{
    int i = fn_index(fn);
    pthread_mutex_lock(&g_lock);
    if (i >= 0)
        g_fn_calls[i]++;
    pthread_mutex_unlock(&g_lock);
}

static void record_sizes(size_t workspace, size_t reserve)
{
    pthread_mutex_lock(&g_lock);
    g_last_workspace = workspace;
    g_last_reserve = reserve;
    pthread_mutex_unlock(&g_lock);
}

/* The stream log: one line per call that takes or uses a stream, in call
 * order ("record E on S", "wait S for E", "<function> on S", ...), so
 * tests can check what a call makes wait for what; standin_take_log()
 * hands it over and clears it. */
static char g_log[8192];
static size_t g_log_len;

static void log_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void log_line(const char *fmt, ...)
{
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof line - 2)
        n = (int)(sizeof line - 2);
    line[n++] = '\n';
    pthread_mutex_lock(&g_lock);
    if (g_log_len + (size_t)n < sizeof g_log) {   /* a full log drops new lines */
        memcpy(g_log + g_log_len, line, (size_t)n);
        g_log_len += (size_t)n;
    }
    pthread_mutex_unlock(&g_lock);
}

/* CUDNN_STANDIN_NO_GPU simulates a machine whose driver is missing.  Read
 * on every call so a test can flip it with monkeypatch.setenv. */
static int no_gpu(void)
{
    return getenv("CUDNN_STANDIN_NO_GPU") != NULL;
}

/* ------------------------------------------------------------------------ */
/* Status names and the last-error detail                                    */
/* ------------------------------------------------------------------------ */

static const char *status_name(cudnnStatus_t s)
{
    /* Deprecated aliases share values with the codes listed here, except
     * CUDNN_STATUS_INVALID_VALUE (2001), which has its own value. */
    switch ((int)s) {
#define NAME(x) case x: return #x;
    NAME(CUDNN_STATUS_SUCCESS)
    NAME(CUDNN_STATUS_NOT_INITIALIZED)
    NAME(CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH)
    NAME(CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH)
    NAME(CUDNN_STATUS_DEPRECATED)
    NAME(CUDNN_STATUS_LICENSE_ERROR)
    NAME(CUDNN_STATUS_RUNTIME_IN_PROGRESS)
    NAME(CUDNN_STATUS_RUNTIME_FP_OVERFLOW)
#if CUDNN_VERSION >= 90200   /* codes newer than 9.0: keep older 9.x headers compiling */
    NAME(CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED)
#endif
    NAME(CUDNN_STATUS_BAD_PARAM)
    NAME(CUDNN_STATUS_INVALID_VALUE)
    NAME(CUDNN_STATUS_BAD_PARAM_NULL_POINTER)
    NAME(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER)
    NAME(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED)
    NAME(CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND)
    NAME(CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT)
    NAME(CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH)
    NAME(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH)
    NAME(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES)
    NAME(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE)
#if CUDNN_VERSION >= 90500
    NAME(CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH)
#endif
#if CUDNN_VERSION >= 90600
    NAME(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE)
#endif
    NAME(CUDNN_STATUS_NOT_SUPPORTED)
    NAME(CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN)
    NAME(CUDNN_STATUS_NOT_SUPPORTED_SHAPE)
    NAME(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE)
    NAME(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT)
    NAME(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER)
    NAME(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART)
    NAME(CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH)
    NAME(CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING)
    NAME(CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE)
    NAME(CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT)
    NAME(CUDNN_STATUS_NOT_SUPPORTED_PADDING)
    NAME(CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM)
#if CUDNN_VERSION >= 90500
    NAME(CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API)
#endif
#if CUDNN_VERSION >= 91800
    NAME(CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE)
#endif
    NAME(CUDNN_STATUS_INTERNAL_ERROR)
    NAME(CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED)
    NAME(CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE)
    NAME(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED)
    NAME(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
    NAME(CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM)
    NAME(CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED)
    NAME(CUDNN_STATUS_EXECUTION_FAILED)
    NAME(CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER)
    NAME(CUDNN_STATUS_EXECUTION_FAILED_CUBLAS)
    NAME(CUDNN_STATUS_EXECUTION_FAILED_CUDART)
    NAME(CUDNN_STATUS_EXECUTION_FAILED_CURAND)
#undef NAME
    default:
        return "CUDNN_STATUS_UNKNOWN";
    }
}

/* Like the real cuDNN 9, the last error message is per thread. */
static _Thread_local char t_last_error[1024];

/* Record "<function>: <STATUS>: <detail>" and return the status, so that
 * error paths read `return fail(CUDNN_STATUS_BAD_PARAM, fn, "...")`. */
static cudnnStatus_t fail(cudnnStatus_t st, const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static cudnnStatus_t fail(cudnnStatus_t st, const char *fn, const char *fmt, ...)
{
    int n = snprintf(t_last_error, sizeof t_last_error, "%s: %s: ", fn, status_name(st));
    if (n >= 0 && (size_t)n < sizeof t_last_error) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(t_last_error + n, sizeof t_last_error - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return st;
}

#define TRY(expr)                                                              \
    do {                                                                       \
        cudnnStatus_t try_status_ = (expr);                                    \
        if (try_status_ != CUDNN_STATUS_SUCCESS)                               \
            return try_status_;                                                \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Registry of live handles and descriptors                                  */
/* ------------------------------------------------------------------------ */

/* Knowing which pointers are live lets us report use-after-destroy,
 * double destroy and "wrong kind of descriptor" as BAD_PARAM instead of
 * reading freed memory (the real library would crash or worse). */
typedef enum { OBJ_HANDLE = 1, OBJ_TENSOR, OBJ_ACTIVATION, OBJ_EVENT } obj_kind_t;

static struct live_obj {
    const void *ptr;
    obj_kind_t kind;
} *g_objs;
static size_t g_n_objs, g_cap_objs;

/* Room for one more item in a growable table (caller holds g_lock). */
static int table_room(void **items, size_t *cap, size_t n, size_t item_size)
{
    if (n < *cap)
        return 1;
    size_t grown_cap = *cap ? 2 * *cap : 64;
    void *grown = realloc(*items, grown_cap * item_size);
    if (!grown)
        return 0;
    *items = grown;
    *cap = grown_cap;
    return 1;
}

static int registry_add(const void *p, obj_kind_t kind)
{
    pthread_mutex_lock(&g_lock);
    int ok = table_room((void **)&g_objs, &g_cap_objs, g_n_objs, sizeof *g_objs);
    if (ok)
        g_objs[g_n_objs++] = (struct live_obj){p, kind};
    pthread_mutex_unlock(&g_lock);
    return ok;
}

/* Removes p if it is a live object of that kind; returns whether it was. */
static int registry_remove(const void *p, obj_kind_t kind)
{
    int found = 0;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_n_objs; i++) {
        if (g_objs[i].ptr == p && g_objs[i].kind == kind) {
            g_objs[i] = g_objs[--g_n_objs];
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return found;
}

static int registry_has(const void *p, obj_kind_t kind)
{
    int found = 0;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_n_objs && !found; i++)
        found = g_objs[i].ptr == p && g_objs[i].kind == kind;
    pthread_mutex_unlock(&g_lock);
    return found;
}

/* ------------------------------------------------------------------------ */
/* Allocation table ("device" memory from cudaMalloc)                        */
/* ------------------------------------------------------------------------ */

/* Tracked so cudaPointerGetAttributes can tell device memory from host
 * memory (interior pointers included), cudaFree can reject pointers it did
 * not hand out, and buffers passed to cuDNN can be bounds-checked. */
static struct block {
    uintptr_t base;
    size_t size;
} *g_blocks;
static size_t g_n_blocks, g_cap_blocks;

/* Real cudaMalloc returns at least 256-byte aligned memory. */
#define DEVICE_ALIGNMENT 256

static int block_add(void *p, size_t size)
{
    pthread_mutex_lock(&g_lock);
    int ok = table_room((void **)&g_blocks, &g_cap_blocks, g_n_blocks, sizeof *g_blocks);
    if (ok)
        g_blocks[g_n_blocks++] = (struct block){(uintptr_t)p, size};
    pthread_mutex_unlock(&g_lock);
    return ok;
}

/* Removes the block that starts exactly at p; returns whether there was one. */
static int block_remove(const void *p)
{
    int found = 0;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_n_blocks; i++) {
        if (g_blocks[i].base == (uintptr_t)p) {
            g_blocks[i] = g_blocks[--g_n_blocks];
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return found;
}

/* Finds the block containing p (interior pointers too). */
static int block_find(const void *p, struct block *out)
{
    int found = 0;
    uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_n_blocks && !found; i++) {
        if (a >= g_blocks[i].base && a - g_blocks[i].base < g_blocks[i].size) {
            *out = g_blocks[i];
            found = 1;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return found;
}

/* If p lies in a cudaMalloc block, how many of the `bytes` starting at p
 * fall past its end (0 if none, or if p is not device memory: plain host
 * pointers are allowed and cannot be checked). */
static size_t bytes_past_block_end(const void *p, size_t bytes)
{
    struct block b;
    if (!block_find(p, &b))
        return 0;
    size_t room = b.size - ((uintptr_t)p - b.base);
    return bytes > room ? bytes - room : 0;
}

/* ------------------------------------------------------------------------ */
/* half / bfloat16 <-> double by bit manipulation                            */
/* ------------------------------------------------------------------------ */

/* Both are IEEE-style binary formats with `eb` exponent bits and `mb`
 * mantissa bits: half is (5, 10), bfloat16 is (8, 7).  One codec serves
 * both, going straight from double so a value is rounded only once. */

static double small_float_decode(unsigned bits, int eb, int mb)
{
    unsigned sign = (bits >> (eb + mb)) & 1u;
    unsigned e = (bits >> mb) & ((1u << eb) - 1u);
    unsigned m = bits & ((1u << mb) - 1u);
    int bias = (1 << (eb - 1)) - 1;
    double v;
    if (e == 0)                              /* zero or subnormal */
        v = ldexp((double)m, 1 - bias - mb);
    else if (e == (1u << eb) - 1u)           /* infinity or NaN */
        v = m ? NAN : INFINITY;
    else
        v = ldexp((double)(m | (1u << mb)), (int)e - bias - mb);
    return sign ? -v : v;
}

/* Round to nearest, ties to even (nearbyint in the default rounding mode). */
static unsigned small_float_encode(double d, int eb, int mb)
{
    unsigned sign = signbit(d) ? 1u << (eb + mb) : 0u;
    unsigned all_ones_exp = ((1u << eb) - 1u) << mb;
    int bias = (1 << (eb - 1)) - 1;
    double a = fabs(d);

    if (isnan(d))
        return sign | all_ones_exp | (1u << (mb - 1));   /* quiet NaN */
    if (isinf(d))
        return sign | all_ones_exp;
    if (a < ldexp(1.0, 1 - bias)) {
        /* Subnormal range: fixed step 2^(1-bias-mb).  Rounding up to
         * 2^mb yields exactly the bit pattern of the smallest normal. */
        return sign | (unsigned)nearbyint(ldexp(a, bias - 1 + mb));
    }
    int ex;
    frexp(a, &ex);                  /* a = f * 2^ex with f in [0.5, 1) */
    int e = ex - 1;                 /* a in [2^e, 2^(e+1)) */
    double q = nearbyint(ldexp(a, mb - e));     /* in [2^mb, 2^(mb+1)] */
    if (q >= ldexp(1.0, mb + 1)) {  /* rounding carried into the exponent */
        q = ldexp(1.0, mb);
        e++;
    }
    if (e > bias)                   /* overflow rounds to infinity */
        return sign | all_ones_exp;
    return sign | ((unsigned)(e + bias) << mb) | ((unsigned)q - (1u << mb));
}

/* ------------------------------------------------------------------------ */
/* Descriptors                                                               */
/* ------------------------------------------------------------------------ */

struct cudnnContext {
    cudaStream_t stream;
};

struct cudnnTensorStruct {
    int is_set;                       /* created but never Set -> unusable */
    cudnnDataType_t type;
    int nb;
    int dims[CUDNN_DIM_MAX];
    int strides[CUDNN_DIM_MAX];
};

struct cudnnActivationStruct {
    int is_set;
    cudnnActivationMode_t mode;
    cudnnNanPropagation_t nan_opt;
    double coef;
};

/* Bytes per element of the data types we compute on; 0 for the others. */
static size_t elem_size(cudnnDataType_t t)
{
    switch (t) {
    case CUDNN_DATA_FLOAT: return 4;
    case CUDNN_DATA_DOUBLE: return 8;
    case CUDNN_DATA_HALF: return 2;
    case CUDNN_DATA_BFLOAT16: return 2;
    default: return 0;
    }
}

static long tensor_count(const struct cudnnTensorStruct *d)
{
    long n = 1;
    for (int i = 0; i < d->nb; i++)
        n *= d->dims[i];
    return n;
}

/* Bytes from the first to one past the last element, through the strides. */
static size_t tensor_span_bytes(const struct cudnnTensorStruct *d)
{
    size_t last = 0;
    for (int i = 0; i < d->nb; i++)
        last += (size_t)(d->dims[i] - 1) * (size_t)d->strides[i];
    return (last + 1) * elem_size(d->type);
}

/* Element offsets (in elements) for every logical index, the logical order
 * being row-major over the descriptor's dims (N, C, spatial...).  This is
 * what lets NCHW, NHWC and any other strided layout share one code path.
 * Caller frees. */
static long *tensor_offsets(const struct cudnnTensorStruct *d)
{
    long count = tensor_count(d);
    long *off = malloc((size_t)count * sizeof *off);
    int idx[CUDNN_DIM_MAX] = {0};
    long cur = 0;
    if (!off)
        return NULL;
    for (long i = 0; i < count; i++) {
        off[i] = cur;
        for (int k = d->nb - 1; k >= 0; k--) {      /* odometer step */
            idx[k]++;
            cur += d->strides[k];
            if (idx[k] < d->dims[k])
                break;
            cur -= (long)d->strides[k] * d->dims[k];
            idx[k] = 0;
        }
    }
    return off;
}

static double load_elem(cudnnDataType_t t, const char *p)
{
    switch (t) {
    case CUDNN_DATA_FLOAT: { float f; memcpy(&f, p, sizeof f); return f; }
    case CUDNN_DATA_DOUBLE: { double d; memcpy(&d, p, sizeof d); return d; }
    case CUDNN_DATA_HALF: { uint16_t h; memcpy(&h, p, 2); return small_float_decode(h, 5, 10); }
    case CUDNN_DATA_BFLOAT16: { uint16_t h; memcpy(&h, p, 2); return small_float_decode(h, 8, 7); }
    default: return NAN;
    }
}

static void store_elem(cudnnDataType_t t, char *p, double v)
{
    switch (t) {
    case CUDNN_DATA_FLOAT: { float f = (float)v; memcpy(p, &f, sizeof f); break; }
    case CUDNN_DATA_DOUBLE: memcpy(p, &v, sizeof v); break;
    case CUDNN_DATA_HALF: { uint16_t h = (uint16_t)small_float_encode(v, 5, 10); memcpy(p, &h, 2); break; }
    case CUDNN_DATA_BFLOAT16: { uint16_t h = (uint16_t)small_float_encode(v, 8, 7); memcpy(p, &h, 2); break; }
    default: break;
    }
}

/* ------------------------------------------------------------------------ */
/* Per-call scratch memory and whole-tensor load/store                       */
/* ------------------------------------------------------------------------ */

/* Every temporary of one call is registered here and freed in one place,
 * so the many early returns cannot leak. */
typedef struct {
    void *p[64];
    int n;
} scratch_t;

static void *scratch_alloc(scratch_t *s, size_t bytes)
{
    if (s->n == (int)(sizeof s->p / sizeof s->p[0]))
        return NULL;
    void *p = calloc(1, bytes ? bytes : 1);
    if (p)
        s->p[s->n++] = p;
    return p;
}

/* n doubles, zeroed. */
static double *scratch_doubles(scratch_t *s, long n)
{
    return scratch_alloc(s, (size_t)n * sizeof(double));
}

static void scratch_free(scratch_t *s)
{
    while (s->n > 0)
        free(s->p[--s->n]);
}

/* All elements of a tensor, as doubles in logical order.  Inputs are read
 * completely before any output is written, which makes in-place calls
 * (y == x, dx == dy) safe. */
static double *read_all(scratch_t *s, const struct cudnnTensorStruct *d, const void *data)
{
    long count = tensor_count(d);
    double *v = scratch_alloc(s, (size_t)count * sizeof *v);
    long *off = tensor_offsets(d);
    size_t es = elem_size(d->type);
    if (v && off)
        for (long i = 0; i < count; i++)
            v[i] = load_elem(d->type, (const char *)data + off[i] * (long)es);
    free(off);
    return off ? v : NULL;
}

static int write_all(const struct cudnnTensorStruct *d, void *data, const double *v)
{
    long count = tensor_count(d);
    long *off = tensor_offsets(d);
    size_t es = elem_size(d->type);
    if (!off)
        return 0;
    for (long i = 0; i < count; i++)
        store_elem(d->type, (char *)data + off[i] * (long)es, v[i]);
    free(off);
    return 1;
}

/* out = alpha*out + beta*old, where old is only read when beta != 0 (the
 * cuDNN blending rule: with beta == 0 the destination may hold garbage). */
static void blend(double *out, const double *old, long n, double alpha, double beta)
{
    for (long i = 0; i < n; i++)
        out[i] = beta != 0.0 ? alpha * out[i] + beta * old[i] : alpha * out[i];
}

/* alpha/beta point to double for DOUBLE data, to float otherwise. */
static double read_scalar(const void *p, cudnnDataType_t data_type)
{
    if (data_type == CUDNN_DATA_DOUBLE) {
        double d;
        memcpy(&d, p, sizeof d);
        return d;
    }
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

/* ------------------------------------------------------------------------ */
/* Argument validation helpers (each records a detail naming the argument)   */
/* ------------------------------------------------------------------------ */

static cudnnStatus_t need(const char *fn, const void *p, const char *what)
{
    if (!p)
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "%s is NULL", what);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t check_handle(const char *fn, cudnnHandle_t h)
{
    if (!h)
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "handle is NULL");
    if (!registry_has(h, OBJ_HANDLE))
        return fail(CUDNN_STATUS_BAD_PARAM, fn,
                    "handle %p is not a live cudnnHandle_t (destroyed, or not from cudnnCreate)",
                    (void *)h);
    return CUDNN_STATUS_SUCCESS;
}

/* A descriptor argument that must be non-NULL, live and already Set. */
static cudnnStatus_t check_tensor(const char *fn, const char *what, cudnnTensorDescriptor_t d)
{
    if (!d)
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "%s is NULL", what);
    if (!registry_has(d, OBJ_TENSOR))
        return fail(CUDNN_STATUS_BAD_PARAM, fn,
                    "%s %p is not a live tensor descriptor "
                    "(destroyed, or not from cudnnCreateTensorDescriptor)", what, (void *)d);
    if (!d->is_set)
        return fail(CUDNN_STATUS_BAD_PARAM, fn,
                    "%s was created but never set (cudnnSetTensorNdDescriptor)", what);
    return CUDNN_STATUS_SUCCESS;
}

/* A data pointer that must be non-NULL and, when it is cudaMalloc memory,
 * must hold the whole tensor (a GPU would fault reading past the end). */
static cudnnStatus_t check_data(const char *fn, const char *what, const void *p, size_t bytes)
{
    TRY(need(fn, p, what));
    size_t over = bytes_past_block_end(p, bytes);
    if (over)
        return fail(CUDNN_STATUS_EXECUTION_FAILED, fn,
                    "%s: %zu bytes needed but the cudaMalloc block ends %zu bytes short "
                    "(a GPU would fault here)", what, bytes, over);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t check_tensor_data(const char *fn, const char *what,
                                       cudnnTensorDescriptor_t d, const void *p)
{
    return check_data(fn, what, p, tensor_span_bytes(d));
}

/* Both pointers or neither (running stats, saved stats). */
static cudnnStatus_t check_pair(const char *fn, const void *a, const char *a_name,
                                const void *b, const char *b_name)
{
    if ((a == NULL) != (b == NULL))
        return fail(CUDNN_STATUS_BAD_PARAM, fn,
                    "%s and %s must be both NULL or both non-NULL (%s is NULL)",
                    a_name, b_name, a ? b_name : a_name);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t check_epsilon(const char *fn, double epsilon)
{
    if (!(epsilon >= CUDNN_BN_MIN_EPSILON))          /* also rejects NaN */
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "epsilon %g is below CUDNN_BN_MIN_EPSILON (%g)",
                    epsilon, (double)CUDNN_BN_MIN_EPSILON);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t check_mode(const char *fn, cudnnBatchNormMode_t mode)
{
    if (mode != CUDNN_BATCHNORM_PER_ACTIVATION && mode != CUDNN_BATCHNORM_SPATIAL &&
        mode != CUDNN_BATCHNORM_SPATIAL_PERSISTENT)
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "mode %d is not a cudnnBatchNormMode_t", (int)mode);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t check_ops(const char *fn, cudnnBatchNormOps_t ops)
{
    if (ops != CUDNN_BATCHNORM_OPS_BN && ops != CUDNN_BATCHNORM_OPS_BN_ACTIVATION &&
        ops != CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION)
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "bnOps %d is not a cudnnBatchNormOps_t", (int)ops);
    return CUDNN_STATUS_SUCCESS;
}

static const char *ops_name(cudnnBatchNormOps_t ops)
{
    switch (ops) {
    case CUDNN_BATCHNORM_OPS_BN: return "CUDNN_BATCHNORM_OPS_BN";
    case CUDNN_BATCHNORM_OPS_BN_ACTIVATION: return "CUDNN_BATCHNORM_OPS_BN_ACTIVATION";
    case CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION: return "CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION";
    default: return "?";
    }
}

/* Whether x is fully packed channels-last (NHWC / NDHWC). */
static int is_nhwc_packed(const struct cudnnTensorStruct *x)
{
    if (x->nb < 4 || x->nb > 5 || x->strides[1] != 1)
        return 0;
    long expect = x->dims[1];
    for (int i = x->nb - 1; i >= 2; i--) {
        if (x->strides[i] != expect)
            return 0;
        expect *= x->dims[i];
    }
    return x->strides[0] == expect;
}

/* Activation ops need a live, set ReLU descriptor, and (cuDNN's documented
 * conditions for its fused NHWC kernel) half NHWC data in SPATIAL_PERSISTENT
 * mode, C % 4 == 0 for add+activation; plain BN ignores the descriptor. */
static cudnnStatus_t check_activation(const char *fn, cudnnBatchNormOps_t ops,
                                      cudnnActivationDescriptor_t a,
                                      const struct cudnnTensorStruct *x, cudnnBatchNormMode_t mode)
{
    if (ops == CUDNN_BATCHNORM_OPS_BN)
        return CUDNN_STATUS_SUCCESS;
    if (x->type != CUDNN_DATA_HALF || !is_nhwc_packed(x) || mode != CUDNN_BATCHNORM_SPATIAL_PERSISTENT
        || (ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION && x->dims[1] % 4))
        return fail(CUDNN_STATUS_NOT_SUPPORTED, fn,
                    "%s runs only on fully packed NHWC half data in SPATIAL_PERSISTENT mode "
                    "(C %% 4 == 0 with add): x type %d, mode %d, C %d",
                    ops_name(ops), (int)x->type, (int)mode, x->dims[1]);
    if (!a)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, fn,
                    "%s needs an activation descriptor but activationDesc is NULL", ops_name(ops));
    if (!registry_has(a, OBJ_ACTIVATION))
        return fail(CUDNN_STATUS_BAD_PARAM, fn,
                    "activationDesc %p is not a live activation descriptor", (void *)a);
    if (!a->is_set)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, fn,
                    "activationDesc was never set; %s supports only CUDNN_ACTIVATION_RELU", ops_name(ops));
    if (a->mode != CUDNN_ACTIVATION_RELU)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, fn,
                    "activation mode %d is not supported with %s (only CUDNN_ACTIVATION_RELU)",
                    (int)a->mode, ops_name(ops));
    return CUDNN_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Batch-norm geometry                                                       */
/* ------------------------------------------------------------------------ */

/* The shape of a batch-norm problem, from x and the mode.  Logical element
 * index i = (n*C + c)*S + s; statistics are gathered per "group". */
typedef struct {
    int N, C;
    long S;                     /* product of the spatial dims */
    long count;                 /* N*C*S */
    int per_activation;
    long groups;                /* C (spatial modes) or C*S (per activation) */
    long m;                     /* elements per group: N*S or N */
    cudnnDataType_t dtype;      /* x/y/z/dy/dx/dz type */
    cudnnDataType_t ptype;      /* scale/bias/mean/variance type */
} bn_geom_t;

static long group_of(const bn_geom_t *g, long i)
{
    long s = i % g->S;
    long c = (i / g->S) % g->C;
    return g->per_activation ? c * g->S + s : c;
}

/* cuDNN's rule: parameters are float unless the data is double. */
static cudnnDataType_t param_type_for(cudnnDataType_t t)
{
    return t == CUDNN_DATA_DOUBLE ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
}

static cudnnStatus_t bn_geometry(const char *fn, cudnnTensorDescriptor_t x,
                                 cudnnBatchNormMode_t mode, bn_geom_t *g)
{
    TRY(check_mode(fn, mode));
    if (x->nb != 4 && x->nb != 5)
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "xDesc has %d dims; batch norm needs 4 or 5", x->nb);
    if (elem_size(x->type) == 0)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, fn,
                    "xDesc data type %d is not supported (FLOAT, DOUBLE, HALF, BFLOAT16 only)",
                    (int)x->type);
    g->N = x->dims[0];
    g->C = x->dims[1];
    g->S = 1;
    for (int i = 2; i < x->nb; i++)
        g->S *= x->dims[i];
    g->count = (long)g->N * g->C * g->S;
    g->per_activation = mode == CUDNN_BATCHNORM_PER_ACTIVATION;
    g->groups = g->per_activation ? g->C * g->S : g->C;
    g->m = g->per_activation ? g->N : g->N * g->S;
    g->dtype = x->type;
    g->ptype = param_type_for(x->type);
    return CUDNN_STATUS_SUCCESS;
}

/* The descriptor cudnnDeriveBNTensorDescriptor produces: 1,C,1,1(,1) or
 * 1,C,H,W(,D), packed, float (double for double x). */
static void derive_bn_desc(struct cudnnTensorStruct *out, const struct cudnnTensorStruct *x,
                           cudnnBatchNormMode_t mode)
{
    out->is_set = 1;
    out->type = param_type_for(x->type);
    out->nb = x->nb;
    out->dims[0] = 1;
    out->dims[1] = x->dims[1];
    for (int i = 2; i < x->nb; i++)
        out->dims[i] = mode == CUDNN_BATCHNORM_PER_ACTIVATION ? x->dims[i] : 1;
    int stride = 1;
    for (int i = x->nb - 1; i >= 0; i--) {
        out->strides[i] = stride;
        stride *= out->dims[i];
    }
}

static int same_dims(const struct cudnnTensorStruct *a, const struct cudnnTensorStruct *b)
{
    if (a->nb != b->nb)
        return 0;
    for (int i = 0; i < a->nb; i++)
        if (a->dims[i] != b->dims[i])
            return 0;
    return 1;
}

static void format_dims(char *buf, size_t size, const struct cudnnTensorStruct *d)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < d->nb && used < size; i++) {
        int n = snprintf(buf + used, size - used, i ? ",%d" : "%d", d->dims[i]);
        if (n < 0)
            break;
        used += (size_t)n;
    }
}

/* y, z, dy, dx, dz: a live, set descriptor with x's dims and data type
 * (strides may differ, e.g. NCHW x with NHWC y). */
static cudnnStatus_t check_like_x(const char *fn, const char *what,
                                  cudnnTensorDescriptor_t d, cudnnTensorDescriptor_t x)
{
    TRY(check_tensor(fn, what, d));
    if (!same_dims(d, x)) {
        char a[128], b[128];
        format_dims(a, sizeof a, d);
        format_dims(b, sizeof b, x);
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "%s dims (%s) differ from xDesc dims (%s)", what, a, b);
    }
    if (d->type != x->type)
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "%s data type %d differs from xDesc data type %d",
                    what, (int)d->type, (int)x->type);
    return CUDNN_STATUS_SUCCESS;
}

/* The scale/bias/mean/variance descriptor must match the derived one. */
static cudnnStatus_t check_param_desc(const char *fn, const char *what, cudnnTensorDescriptor_t p,
                                      cudnnTensorDescriptor_t x, cudnnBatchNormMode_t mode)
{
    struct cudnnTensorStruct want;
    TRY(check_tensor(fn, what, p));
    derive_bn_desc(&want, x, mode);
    if (!same_dims(p, &want)) {
        char a[128], b[128];
        format_dims(a, sizeof a, p);
        format_dims(b, sizeof b, &want);
        return fail(CUDNN_STATUS_BAD_PARAM, fn,
                    "%s dims (%s) do not match the batch-norm parameter shape (%s) for this x and mode",
                    what, a, b);
    }
    if (p->type != want.type)
        return fail(CUDNN_STATUS_BAD_PARAM, fn,
                    "%s data type %d must be %d (%s) for x data type %d", what, (int)p->type,
                    (int)want.type, want.type == CUDNN_DATA_DOUBLE ? "DOUBLE" : "FLOAT", (int)x->type);
    return CUDNN_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Workspace and reserve space                                               */
/* ------------------------------------------------------------------------ */

/* Non-zero and shape dependent, so a binding that ignores the queries (or
 * passes a stale size) is caught. */
static size_t forward_workspace_bytes(const bn_geom_t *g) { return 256 + 16 * (size_t)g->groups; }
static size_t backward_workspace_bytes(const bn_geom_t *g) { return 512 + 16 * (size_t)g->groups; }

/* Reserve layout: a header, then (activation ops) one byte per element of
 * x saying whether the pre-activation value was > 0, in logical order. */
#define RESERVE_HEADER_BYTES 128
#define RESERVE_MAGIC 0x4e4944444e415453ull      /* "STANDDIN" */

typedef struct {
    uint64_t magic;
    int64_t count, n, c, s;
    int32_t mode, ops;
} reserve_header_t;

_Static_assert(sizeof(reserve_header_t) <= RESERVE_HEADER_BYTES, "reserve header too big");

static size_t reserve_bytes(const bn_geom_t *g, cudnnBatchNormOps_t ops)
{
    return RESERVE_HEADER_BYTES + (ops != CUDNN_BATCHNORM_OPS_BN ? (size_t)g->count : 0);
}

static reserve_header_t make_reserve_header(const bn_geom_t *g, cudnnBatchNormMode_t mode,
                                            cudnnBatchNormOps_t ops)
{
    reserve_header_t h;
    memset(&h, 0, sizeof h);
    h.magic = RESERVE_MAGIC;
    h.count = g->count;
    h.n = g->N;
    h.c = g->C;
    h.s = g->S;
    h.mode = (int32_t)mode;
    h.ops = (int32_t)ops;
    return h;
}

/* workspace/reserve: non-NULL, at least `needed` bytes claimed, and the
 * claim must fit in its cudaMalloc block. */
static cudnnStatus_t check_buffer(const char *fn, const char *what, const char *size_arg,
                                  const void *p, size_t given, size_t needed, const char *query)
{
    if (!p)
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "%s is NULL (%s asks for %zu bytes)", what, query, needed);
    if (given < needed)
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "%s %zu is smaller than the %zu bytes %s asks for",
                    size_arg, given, needed, query);
    return check_data(fn, what, p, given);
}

/* A real library scribbles on its workspace; so do we, so that nothing can
 * rely on workspace contents surviving a call. */
static void scribble(void *workspace, size_t bytes)
{
    memset(workspace, 0xA5, bytes);
}

/* ------------------------------------------------------------------------ */
/* The numbers                                                               */
/* ------------------------------------------------------------------------ */

/* Batch mean and biased variance of every group, two-pass in double. */
static void batch_stats(const bn_geom_t *g, const double *x, double *mean, double *var)
{
    for (long k = 0; k < g->groups; k++)
        mean[k] = var[k] = 0.0;
    for (long i = 0; i < g->count; i++)
        mean[group_of(g, i)] += x[i];
    for (long k = 0; k < g->groups; k++)
        mean[k] /= (double)g->m;
    for (long i = 0; i < g->count; i++) {
        double d = x[i] - mean[group_of(g, i)];
        var[group_of(g, i)] += d * d;
    }
    for (long k = 0; k < g->groups; k++)
        var[k] /= (double)g->m;
}

/* y = act(scale*(x-mean)*invstd + bias [+ z]), before alpha/beta blending.
 * With activation ops, mask[i] records whether the pre-activation was > 0. */
static void normalize(const bn_geom_t *g, cudnnBatchNormOps_t ops, const double *x, const double *z,
                      const double *mean, const double *invstd, const double *scale,
                      const double *bias, double *y, unsigned char *mask)
{
    for (long i = 0; i < g->count; i++) {
        long k = group_of(g, i);
        double v = scale[k] * (x[i] - mean[k]) * invstd[k] + bias[k];
        if (z)
            v += z[i];
        if (ops != CUDNN_BATCHNORM_OPS_BN) {
            mask[i] = v > 0.0;
            v = v > 0.0 ? v : 0.0;
        }
        y[i] = v;
    }
}

/* Training-mode batch-norm gradient.  grad[i] = dy, masked by the ReLU
 * derivative when mask != NULL; it is also dz for BN_ADD_ACTIVATION. */
static void normalize_backward(const bn_geom_t *g, const double *x, const double *dy,
                               const unsigned char *mask, const double *mean, const double *invstd,
                               const double *scale, double *grad, double *dx,
                               double *dscale, double *dbias)
{
    for (long k = 0; k < g->groups; k++)
        dscale[k] = dbias[k] = 0.0;
    for (long i = 0; i < g->count; i++) {
        long k = group_of(g, i);
        grad[i] = (mask && !mask[i]) ? 0.0 : dy[i];
        dbias[k] += grad[i];
        dscale[k] += grad[i] * (x[i] - mean[k]) * invstd[k];
    }
    for (long i = 0; i < g->count; i++) {
        long k = group_of(g, i);
        double xhat = (x[i] - mean[k]) * invstd[k];
        double m = (double)g->m;
        dx[i] = scale[k] * invstd[k] * (grad[i] - dbias[k] / m - xhat * dscale[k] / m);
    }
}

/* ======================================================================== */
/* cuDNN: library, handle, errors                                            */
/* ======================================================================== */

size_t cudnnGetVersion(void)
{
    count_call(__func__);
    return CUDNN_VERSION;
}

size_t cudnnGetCudartVersion(void)
{
    count_call(__func__);
    return CUDART_VERSION;
}

const char *cudnnGetErrorString(cudnnStatus_t status)
{
    count_call(__func__);
    return status_name(status);
}

/* Copy the last detail (truncated, NUL-terminated) and clear it. */
void cudnnGetLastErrorString(char *message, size_t max_size)
{
    count_call(__func__);
    if (!message || max_size == 0)
        return;
    size_t len = strlen(t_last_error);
    if (len > max_size - 1)
        len = max_size - 1;
    memcpy(message, t_last_error, len);
    message[len] = '\0';
    t_last_error[0] = '\0';
}

cudnnStatus_t cudnnCreate(cudnnHandle_t *handle)
{
    const char *fn = __func__;
    count_call(fn);
    TRY(need(fn, handle, "handle (output pointer)"));
    if (no_gpu())
        return fail(CUDNN_STATUS_NOT_INITIALIZED, fn,
                    "cudaGetDeviceCount() returned cuda error %d (%s)", (int)cudaErrorInsufficientDriver,
                    "CUDA driver version is insufficient for CUDA runtime version");
    struct cudnnContext *h = calloc(1, sizeof *h);
    if (!h || !registry_add(h, OBJ_HANDLE)) {
        free(h);
        return fail(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, fn, "out of host memory");
    }
    *handle = h;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle)
{
    const char *fn = __func__;
    count_call(fn);
    TRY(need(fn, handle, "handle"));
    if (!registry_remove(handle, OBJ_HANDLE))
        return fail(CUDNN_STATUS_BAD_PARAM, fn,
                    "handle %p is not a live cudnnHandle_t (double destroy?)", (void *)handle);
    free(handle);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId)
{
    const char *fn = __func__;
    count_call(fn);
    TRY(check_handle(fn, handle));
    handle->stream = streamId;          /* opaque: nothing runs asynchronously here */
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t *streamId)
{
    const char *fn = __func__;
    count_call(fn);
    TRY(check_handle(fn, handle));
    TRY(need(fn, streamId, "streamId (output pointer)"));
    *streamId = handle->stream;
    return CUDNN_STATUS_SUCCESS;
}

/* ======================================================================== */
/* cuDNN: tensor and activation descriptors                                  */
/* ======================================================================== */

/* Descriptors of every kind are zeroed host blocks in the object registry
 * (so a stale or doubly destroyed one is recognised). */
static cudnnStatus_t new_object(const char *fn, void **out, size_t size, int kind)
{
    void *obj = calloc(1, size);
    if (!obj || !registry_add(obj, kind)) {
        free(obj);
        return fail(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, fn, "out of host memory");
    }
    *out = obj;
    return CUDNN_STATUS_SUCCESS;
}

/* NULL is fine (as in cuDNN); anything else must be a live object of `kind`. */
static cudnnStatus_t free_object(const char *fn, void *obj, int kind, const char *what)
{
    if (!obj)
        return CUDNN_STATUS_SUCCESS;
    if (!registry_remove(obj, kind))
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "%s %p is not a live %s (double destroy?)", what,
                    obj, kind == OBJ_TENSOR ? "tensor descriptor" : "activation descriptor");
    free(obj);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *tensorDesc)
{
    const char *fn = __func__;
    count_call(fn);
    TRY(need(fn, tensorDesc, "tensorDesc (output pointer)"));
    return new_object(fn, (void **)tensorDesc, sizeof(struct cudnnTensorStruct), OBJ_TENSOR);
}

/* The data types every cuDNN 9 header has (later 9.x releases add more;
 * naming them would break builds against older headers, and batch norm
 * only computes on FLOAT/DOUBLE/HALF/BFLOAT16 anyway). */
static int is_known_data_type(cudnnDataType_t t)
{
    return (int)t >= (int)CUDNN_DATA_FLOAT && (int)t <= (int)CUDNN_DATA_FAST_FLOAT_FOR_FP8;
}

cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t tensorDesc, cudnnDataType_t dataType,
                                         int nbDims, const int dimA[], const int strideA[])
{
    const char *fn = __func__;
    count_call(fn);
    TRY(need(fn, tensorDesc, "tensorDesc"));
    if (!registry_has(tensorDesc, OBJ_TENSOR))
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "tensorDesc %p is not a live tensor descriptor",
                    (void *)tensorDesc);
    if (!is_known_data_type(dataType))
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "dataType %d is not a cudnnDataType_t", (int)dataType);
    if (nbDims < 3 || nbDims > CUDNN_DIM_MAX)
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "nbDims %d is outside 3..%d", nbDims, CUDNN_DIM_MAX);
    TRY(need(fn, dimA, "dimA"));
    TRY(need(fn, strideA, "strideA"));
    double elements = 1.0, span = 1.0;
    for (int i = 0; i < nbDims; i++) {
        if (dimA[i] <= 0)
            return fail(CUDNN_STATUS_BAD_PARAM, fn, "dimA[%d] = %d is not positive", i, dimA[i]);
        if (strideA[i] <= 0)
            return fail(CUDNN_STATUS_BAD_PARAM, fn, "strideA[%d] = %d is not positive", i, strideA[i]);
        elements *= dimA[i];
        span += (double)(dimA[i] - 1) * strideA[i];
    }
    /* cuDNN tensors are limited to 2^31-1 elements; the span bound keeps
     * our 64-bit offset arithmetic exact. */
    if (elements > 2147483647.0 || span > 1099511627776.0)
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "tensor too large (%.0f elements, span %.0f)",
                    elements, span);
    tensorDesc->is_set = 1;
    tensorDesc->type = dataType;
    tensorDesc->nb = nbDims;
    for (int i = 0; i < nbDims; i++) {
        tensorDesc->dims[i] = dimA[i];
        tensorDesc->strides[i] = strideA[i];
    }
    return CUDNN_STATUS_SUCCESS;
}

/* Fills min(nbDimsRequested, nbDims) dims/strides; *nbDims gets the real count. */
cudnnStatus_t cudnnGetTensorNdDescriptor(const cudnnTensorDescriptor_t tensorDesc, int nbDimsRequested,
                                         cudnnDataType_t *dataType, int *nbDims, int dimA[], int strideA[])
{
    const char *fn = __func__;
    count_call(fn);
    TRY(check_tensor(fn, "tensorDesc", tensorDesc));
    if (nbDimsRequested < 0)
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "nbDimsRequested %d is negative", nbDimsRequested);
    TRY(need(fn, dataType, "dataType (output pointer)"));
    TRY(need(fn, nbDims, "nbDims (output pointer)"));
    int n = nbDimsRequested < tensorDesc->nb ? nbDimsRequested : tensorDesc->nb;
    if (n > 0) {
        TRY(need(fn, dimA, "dimA"));
        TRY(need(fn, strideA, "strideA"));
    }
    *dataType = tensorDesc->type;
    *nbDims = tensorDesc->nb;
    for (int i = 0; i < n; i++) {
        dimA[i] = tensorDesc->dims[i];
        strideA[i] = tensorDesc->strides[i];
    }
    return CUDNN_STATUS_SUCCESS;
}

/* NULL is a no-op (as in cuDNN); an unknown pointer is reported. */
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc)
{
    count_call(__func__);
    return free_object(__func__, tensorDesc, OBJ_TENSOR, "tensorDesc");
}

/* The real library dereferences NULL here; we report BAD_PARAM instead. */
cudnnStatus_t cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t derivedBnDesc,
                                            const cudnnTensorDescriptor_t xDesc, cudnnBatchNormMode_t mode)
{
    const char *fn = __func__;
    count_call(fn);
    bn_geom_t g;
    TRY(need(fn, derivedBnDesc, "derivedBnDesc"));
    if (!registry_has(derivedBnDesc, OBJ_TENSOR))
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "derivedBnDesc %p is not a live tensor descriptor",
                    (void *)derivedBnDesc);
    TRY(check_tensor(fn, "xDesc", xDesc));
    TRY(bn_geometry(fn, xDesc, mode, &g));
    derive_bn_desc(derivedBnDesc, xDesc, mode);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t *activationDesc)
{
    const char *fn = __func__;
    count_call(fn);
    TRY(need(fn, activationDesc, "activationDesc (output pointer)"));
    return new_object(fn, (void **)activationDesc, sizeof(struct cudnnActivationStruct),
                      OBJ_ACTIVATION);
}

cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t activationDesc,
                                           cudnnActivationMode_t mode, cudnnNanPropagation_t reluNanOpt,
                                           double coef)
{
    const char *fn = __func__;
    count_call(fn);
    TRY(need(fn, activationDesc, "activationDesc"));
    if (!registry_has(activationDesc, OBJ_ACTIVATION))
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "activationDesc %p is not a live activation descriptor",
                    (void *)activationDesc);
    if ((int)mode < (int)CUDNN_ACTIVATION_SIGMOID || (int)mode > (int)CUDNN_ACTIVATION_SWISH)
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "mode %d is not a cudnnActivationMode_t", (int)mode);
    if (reluNanOpt != CUDNN_NOT_PROPAGATE_NAN && reluNanOpt != CUDNN_PROPAGATE_NAN)
        return fail(CUDNN_STATUS_BAD_PARAM, fn, "reluNanOpt %d is not a cudnnNanPropagation_t",
                    (int)reluNanOpt);
    activationDesc->is_set = 1;
    activationDesc->mode = mode;
    activationDesc->nan_opt = reluNanOpt;
    activationDesc->coef = coef;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t activationDesc)
{
    count_call(__func__);
    return free_object(__func__, activationDesc, OBJ_ACTIVATION, "activationDesc");
}

/* ======================================================================== */
/* cuDNN: workspace / reserve size queries                                   */
/* ======================================================================== */

cudnnStatus_t cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps,
    const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t zDesc,
    const cudnnTensorDescriptor_t yDesc, const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc,
    const cudnnActivationDescriptor_t activationDesc, size_t *sizeInBytes)
{
    const char *fn = __func__;
    count_call(fn);
    bn_geom_t g;
    TRY(check_handle(fn, handle));
    TRY(check_ops(fn, bnOps));
    TRY(check_tensor(fn, "xDesc", xDesc));
    TRY(bn_geometry(fn, xDesc, mode, &g));
    TRY(check_like_x(fn, "yDesc", yDesc, xDesc));
    if (bnOps == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION)
        TRY(check_like_x(fn, "zDesc", zDesc, xDesc));
    TRY(check_param_desc(fn, "bnScaleBiasMeanVarDesc", bnScaleBiasMeanVarDesc, xDesc, mode));
    TRY(check_activation(fn, bnOps, activationDesc, xDesc, mode));
    TRY(need(fn, sizeInBytes, "sizeInBytes (output pointer)"));
    *sizeInBytes = forward_workspace_bytes(&g);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetBatchNormalizationBackwardExWorkspaceSize(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps,
    const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t yDesc,
    const cudnnTensorDescriptor_t dyDesc, const cudnnTensorDescriptor_t dzDesc,
    const cudnnTensorDescriptor_t dxDesc, const cudnnTensorDescriptor_t dBnScaleBiasDesc,
    const cudnnActivationDescriptor_t activationDesc, size_t *sizeInBytes)
{
    const char *fn = __func__;
    count_call(fn);
    bn_geom_t g;
    TRY(check_handle(fn, handle));
    TRY(check_ops(fn, bnOps));
    TRY(check_tensor(fn, "xDesc", xDesc));
    TRY(bn_geometry(fn, xDesc, mode, &g));
    /* y is only needed (and so only required) with an activation. */
    if (bnOps != CUDNN_BATCHNORM_OPS_BN || yDesc)
        TRY(check_like_x(fn, "yDesc", yDesc, xDesc));
    TRY(check_like_x(fn, "dyDesc", dyDesc, xDesc));
    if (bnOps == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION)
        TRY(check_like_x(fn, "dzDesc", dzDesc, xDesc));
    TRY(check_like_x(fn, "dxDesc", dxDesc, xDesc));
    TRY(check_param_desc(fn, "dBnScaleBiasDesc", dBnScaleBiasDesc, xDesc, mode));
    TRY(check_activation(fn, bnOps, activationDesc, xDesc, mode));
    TRY(need(fn, sizeInBytes, "sizeInBytes (output pointer)"));
    *sizeInBytes = backward_workspace_bytes(&g);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps,
    const cudnnActivationDescriptor_t activationDesc, const cudnnTensorDescriptor_t xDesc,
    size_t *sizeInBytes)
{
    const char *fn = __func__;
    count_call(fn);
    bn_geom_t g;
    TRY(check_handle(fn, handle));
    TRY(check_ops(fn, bnOps));
    TRY(check_tensor(fn, "xDesc", xDesc));
    TRY(bn_geometry(fn, xDesc, mode, &g));
    TRY(check_activation(fn, bnOps, activationDesc, xDesc, mode));
    TRY(need(fn, sizeInBytes, "sizeInBytes (output pointer)"));
    *sizeInBytes = reserve_bytes(&g, bnOps);
    return CUDNN_STATUS_SUCCESS;
}

/* ======================================================================== */
/* cuDNN: batch normalization compute                                        */
/* ======================================================================== */

#define OOM_FAIL(fn, s) (scratch_free(s), fail(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, \
                                              (fn), "out of host memory"))

/* Running stats: new = (1-f)*old + f*batch, with the unbiased variance.
 * The old value is not read when f == 1: cuDNN documents factor = 1 for
 * the first call of a training run, when the buffers may be uninitialized. */
static int update_running_stats(scratch_t *s, const bn_geom_t *g, cudnnTensorDescriptor_t pdesc,
                                 void *running_mean, void *running_var, double factor,
                                 const double *mean, const double *var)
{
    int read_old = factor != 1.0;
    double *rm = read_old ? read_all(s, pdesc, running_mean) : scratch_doubles(s, g->groups);
    double *rv = read_old ? read_all(s, pdesc, running_var) : scratch_doubles(s, g->groups);
    if (!rm || !rv)
        return 0;
    /* Group size 1 has no unbiased variance (n/(n-1) undefined): use the
     * biased one, which is 0. */
    double unbias = g->m > 1 ? (double)g->m / (double)(g->m - 1) : 1.0;
    for (long k = 0; k < g->groups; k++) {
        rm[k] = (1.0 - factor) * rm[k] + factor * mean[k];
        rv[k] = (1.0 - factor) * rv[k] + factor * var[k] * unbias;
    }
    return write_all(pdesc, running_mean, rm) && write_all(pdesc, running_var, rv);
}

cudnnStatus_t cudnnBatchNormalizationForwardTrainingEx(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps, const void *alpha,
    const void *beta, const cudnnTensorDescriptor_t xDesc, const void *xData,
    const cudnnTensorDescriptor_t zDesc, const void *zData, const cudnnTensorDescriptor_t yDesc,
    void *yData, const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale,
    const void *bnBias, double exponentialAverageFactor, void *resultRunningMean,
    void *resultRunningVariance, double epsilon, void *resultSaveMean, void *resultSaveInvVariance,
    cudnnActivationDescriptor_t activationDesc, void *workspace, size_t workSpaceSizeInBytes,
    void *reserveSpace, size_t reserveSpaceSizeInBytes)
{
    const char *fn = __func__;
    const cudnnTensorDescriptor_t pdesc = bnScaleBiasMeanVarDesc;
    const int add = bnOps == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION;
    bn_geom_t g;
    count_call(fn);
    record_sizes(workSpaceSizeInBytes, reserveSpaceSizeInBytes);

    /* --- validate everything before touching any output --- */
    TRY(check_handle(fn, handle));
    log_line("%s on %p mode %d", fn, (void *)handle->stream, (int)mode);
    TRY(check_ops(fn, bnOps));
    TRY(need(fn, alpha, "alpha"));
    TRY(need(fn, beta, "beta"));
    TRY(check_tensor(fn, "xDesc", xDesc));
    TRY(bn_geometry(fn, xDesc, mode, &g));
    TRY(check_tensor_data(fn, "xData", xDesc, xData));
    if (add) {
        TRY(check_like_x(fn, "zDesc", zDesc, xDesc));
        TRY(check_tensor_data(fn, "zData", zDesc, zData));
    }
    TRY(check_like_x(fn, "yDesc", yDesc, xDesc));
    TRY(check_tensor_data(fn, "yData", yDesc, yData));
    TRY(check_param_desc(fn, "bnScaleBiasMeanVarDesc", pdesc, xDesc, mode));
    TRY(check_tensor_data(fn, "bnScale", pdesc, bnScale));
    TRY(check_tensor_data(fn, "bnBias", pdesc, bnBias));
    TRY(check_pair(fn, resultRunningMean, "resultRunningMean",
                   resultRunningVariance, "resultRunningVariance"));
    if (resultRunningMean) {
        TRY(check_tensor_data(fn, "resultRunningMean", pdesc, resultRunningMean));
        TRY(check_tensor_data(fn, "resultRunningVariance", pdesc, resultRunningVariance));
    }
    TRY(check_epsilon(fn, epsilon));
    TRY(check_pair(fn, resultSaveMean, "resultSaveMean", resultSaveInvVariance, "resultSaveInvVariance"));
    if (resultSaveMean) {
        TRY(check_tensor_data(fn, "resultSaveMean", pdesc, resultSaveMean));
        TRY(check_tensor_data(fn, "resultSaveInvVariance", pdesc, resultSaveInvVariance));
    }
    TRY(check_activation(fn, bnOps, activationDesc, xDesc, mode));
    TRY(check_buffer(fn, "workspace", "workSpaceSizeInBytes", workspace, workSpaceSizeInBytes,
                     forward_workspace_bytes(&g),
                     "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize"));
    TRY(check_buffer(fn, "reserveSpace", "reserveSpaceSizeInBytes", reserveSpace, reserveSpaceSizeInBytes,
                     reserve_bytes(&g, bnOps), "cudnnGetBatchNormalizationTrainingExReserveSpaceSize"));

    /* --- read every input --- */
    scratch_t s = {0};
    double a = read_scalar(alpha, g.dtype), b = read_scalar(beta, g.dtype);
    double *x = read_all(&s, xDesc, xData);
    double *z = add ? read_all(&s, zDesc, zData) : NULL;
    double *y_old = b != 0.0 ? read_all(&s, yDesc, yData) : NULL;
    double *scale = read_all(&s, pdesc, bnScale);
    double *bias = read_all(&s, pdesc, bnBias);
    double *mean = scratch_doubles(&s, g.groups);
    double *var = scratch_doubles(&s, g.groups);
    double *invstd = scratch_doubles(&s, g.groups);
    double *y = scratch_doubles(&s, g.count);
    unsigned char *mask = scratch_alloc(&s, (size_t)g.count);
    if (!x || (add && !z) || (b != 0.0 && !y_old) || !scale || !bias || !mean || !var || !invstd ||
        !y || !mask)
        return OOM_FAIL(fn, &s);

    /* --- compute --- */
    scribble(workspace, workSpaceSizeInBytes);
    batch_stats(&g, x, mean, var);
    for (long k = 0; k < g.groups; k++)
        invstd[k] = 1.0 / sqrt(var[k] + epsilon);
    normalize(&g, bnOps, x, z, mean, invstd, scale, bias, y, mask);
    blend(y, y_old, g.count, a, b);

    /* --- write every output --- */
    int ok = write_all(yDesc, yData, y);
    if (ok && resultRunningMean)
        ok = update_running_stats(&s, &g, pdesc, resultRunningMean, resultRunningVariance,
                                  exponentialAverageFactor, mean, var);
    if (ok && resultSaveMean)
        ok = write_all(pdesc, resultSaveMean, mean) && write_all(pdesc, resultSaveInvVariance, invstd);
    if (!ok)
        return OOM_FAIL(fn, &s);
    reserve_header_t h = make_reserve_header(&g, mode, bnOps);
    memset(reserveSpace, 0, RESERVE_HEADER_BYTES);
    memcpy(reserveSpace, &h, sizeof h);
    if (bnOps != CUDNN_BATCHNORM_OPS_BN)
        memcpy((char *)reserveSpace + RESERVE_HEADER_BYTES, mask, (size_t)g.count);
    scratch_free(&s);
    return CUDNN_STATUS_SUCCESS;
}

/* The real library dereferences a NULL handle; we report BAD_PARAM. */
cudnnStatus_t cudnnBatchNormalizationForwardInference(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t yDesc, void *y,
    const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale, const void *bnBias,
    const void *estimatedMean, const void *estimatedVariance, double epsilon)
{
    const char *fn = __func__;
    const cudnnTensorDescriptor_t pdesc = bnScaleBiasMeanVarDesc;
    bn_geom_t g;
    count_call(fn);

    TRY(check_handle(fn, handle));
    log_line("%s on %p mode %d", fn, (void *)handle->stream, (int)mode);
    TRY(need(fn, alpha, "alpha"));
    TRY(need(fn, beta, "beta"));
    TRY(check_tensor(fn, "xDesc", xDesc));
    TRY(bn_geometry(fn, xDesc, mode, &g));
    TRY(check_tensor_data(fn, "x", xDesc, x));
    TRY(check_like_x(fn, "yDesc", yDesc, xDesc));
    TRY(check_tensor_data(fn, "y", yDesc, y));
    TRY(check_param_desc(fn, "bnScaleBiasMeanVarDesc", pdesc, xDesc, mode));
    TRY(check_tensor_data(fn, "bnScale", pdesc, bnScale));
    TRY(check_tensor_data(fn, "bnBias", pdesc, bnBias));
    TRY(check_tensor_data(fn, "estimatedMean", pdesc, estimatedMean));
    TRY(check_tensor_data(fn, "estimatedVariance", pdesc, estimatedVariance));
    TRY(check_epsilon(fn, epsilon));

    scratch_t s = {0};
    double a = read_scalar(alpha, g.dtype), b = read_scalar(beta, g.dtype);
    double *xs = read_all(&s, xDesc, x);
    double *y_old = b != 0.0 ? read_all(&s, yDesc, y) : NULL;
    double *scale = read_all(&s, pdesc, bnScale);
    double *bias = read_all(&s, pdesc, bnBias);
    double *mean = read_all(&s, pdesc, estimatedMean);
    double *invstd = read_all(&s, pdesc, estimatedVariance);     /* variance, turned into invstd below */
    double *ys = scratch_doubles(&s, g.count);
    if (!xs || (b != 0.0 && !y_old) || !scale || !bias || !mean || !invstd || !ys)
        return OOM_FAIL(fn, &s);

    for (long k = 0; k < g.groups; k++)
        invstd[k] = 1.0 / sqrt(invstd[k] + epsilon);
    normalize(&g, CUDNN_BATCHNORM_OPS_BN, xs, NULL, mean, invstd, scale, bias, ys, NULL);
    blend(ys, y_old, g.count, a, b);
    if (!write_all(yDesc, y, ys))
        return OOM_FAIL(fn, &s);
    scratch_free(&s);
    return CUDNN_STATUS_SUCCESS;
}

/* The reserve must come from a forward training call with the same shape,
 * mode and ops; that is where the ReLU mask lives. */
static cudnnStatus_t check_reserve_contents(const char *fn, const void *reserve, const bn_geom_t *g,
                                            cudnnBatchNormMode_t mode, cudnnBatchNormOps_t ops)
{
    reserve_header_t have, want = make_reserve_header(g, mode, ops);
    memcpy(&have, reserve, sizeof have);
    if (have.magic != want.magic)
        return fail(CUDNN_STATUS_BAD_PARAM, fn,
                    "reserve space was not written by a forward training call "
                    "(cudnnBatchNormalizationForwardTrainingEx) with the same shape/mode/ops");
    if (have.count != want.count || have.n != want.n || have.c != want.c || have.s != want.s ||
        have.mode != want.mode || have.ops != want.ops)
        return fail(CUDNN_STATUS_BAD_PARAM, fn,
                    "reserve space was not written by a forward training call with the same shape/mode/ops "
                    "(forward: N=%lld C=%lld spatial=%lld mode=%d ops=%d; backward: N=%lld C=%lld "
                    "spatial=%lld mode=%d ops=%d)",
                    (long long)have.n, (long long)have.c, (long long)have.s, (int)have.mode, (int)have.ops,
                    (long long)want.n, (long long)want.c, (long long)want.s, (int)want.mode, (int)want.ops);
    return CUDNN_STATUS_SUCCESS;
}

/* The real library dereferences a NULL handle; we report BAD_PARAM. */
cudnnStatus_t cudnnBatchNormalizationBackwardEx(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps, const void *alphaDataDiff,
    const void *betaDataDiff, const void *alphaParamDiff, const void *betaParamDiff,
    const cudnnTensorDescriptor_t xDesc, const void *xData, const cudnnTensorDescriptor_t yDesc,
    const void *yData, const cudnnTensorDescriptor_t dyDesc, const void *dyData,
    const cudnnTensorDescriptor_t dzDesc, void *dzData, const cudnnTensorDescriptor_t dxDesc, void *dxData,
    const cudnnTensorDescriptor_t dBnScaleBiasDesc, const void *bnScaleData, const void *bnBiasData,
    void *dBnScaleData, void *dBnBiasData, double epsilon, const void *savedMean,
    const void *savedInvVariance, cudnnActivationDescriptor_t activationDesc, void *workSpace,
    size_t workSpaceSizeInBytes, void *reserveSpace, size_t reserveSpaceSizeInBytes)
{
    const char *fn = __func__;
    const cudnnTensorDescriptor_t pdesc = dBnScaleBiasDesc;
    const int act = bnOps != CUDNN_BATCHNORM_OPS_BN;
    const int add = bnOps == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION;
    bn_geom_t g;
    count_call(fn);
    record_sizes(workSpaceSizeInBytes, reserveSpaceSizeInBytes);

    /* --- validate everything before touching any output --- */
    TRY(check_handle(fn, handle));
    log_line("%s on %p mode %d", fn, (void *)handle->stream, (int)mode);
    TRY(check_ops(fn, bnOps));
    TRY(need(fn, alphaDataDiff, "alphaDataDiff"));
    TRY(need(fn, betaDataDiff, "betaDataDiff"));
    TRY(need(fn, alphaParamDiff, "alphaParamDiff"));
    TRY(need(fn, betaParamDiff, "betaParamDiff"));
    TRY(check_tensor(fn, "xDesc", xDesc));
    TRY(bn_geometry(fn, xDesc, mode, &g));
    TRY(check_tensor_data(fn, "xData", xDesc, xData));
    if (act) {    /* cuDNN needs y (and bias) to back-propagate through the activation */
        TRY(check_like_x(fn, "yDesc", yDesc, xDesc));
        TRY(check_tensor_data(fn, "yData", yDesc, yData));
    } else if (yDesc) {
        TRY(check_like_x(fn, "yDesc", yDesc, xDesc));
    }
    TRY(check_like_x(fn, "dyDesc", dyDesc, xDesc));
    TRY(check_tensor_data(fn, "dyData", dyDesc, dyData));
    if (add) {
        TRY(check_like_x(fn, "dzDesc", dzDesc, xDesc));
        TRY(check_tensor_data(fn, "dzData", dzDesc, dzData));
    }
    TRY(check_like_x(fn, "dxDesc", dxDesc, xDesc));
    TRY(check_tensor_data(fn, "dxData", dxDesc, dxData));
    TRY(check_param_desc(fn, "dBnScaleBiasDesc", pdesc, xDesc, mode));
    TRY(check_tensor_data(fn, "bnScaleData", pdesc, bnScaleData));
    if (act)
        TRY(check_tensor_data(fn, "bnBiasData", pdesc, bnBiasData));
    TRY(check_tensor_data(fn, "dBnScaleData", pdesc, dBnScaleData));
    TRY(check_tensor_data(fn, "dBnBiasData", pdesc, dBnBiasData));
    TRY(check_epsilon(fn, epsilon));
    TRY(check_pair(fn, savedMean, "savedMean", savedInvVariance, "savedInvVariance"));
    if (savedMean) {
        TRY(check_tensor_data(fn, "savedMean", pdesc, savedMean));
        TRY(check_tensor_data(fn, "savedInvVariance", pdesc, savedInvVariance));
    }
    TRY(check_activation(fn, bnOps, activationDesc, xDesc, mode));
    TRY(check_buffer(fn, "workSpace", "workSpaceSizeInBytes", workSpace, workSpaceSizeInBytes,
                     backward_workspace_bytes(&g), "cudnnGetBatchNormalizationBackwardExWorkspaceSize"));
    TRY(check_buffer(fn, "reserveSpace", "reserveSpaceSizeInBytes", reserveSpace, reserveSpaceSizeInBytes,
                     reserve_bytes(&g, bnOps), "cudnnGetBatchNormalizationTrainingExReserveSpaceSize"));
    TRY(check_reserve_contents(fn, reserveSpace, &g, mode, bnOps));

    /* --- read every input --- */
    scratch_t s = {0};
    double a_data = read_scalar(alphaDataDiff, g.dtype), b_data = read_scalar(betaDataDiff, g.dtype);
    double a_param = read_scalar(alphaParamDiff, g.dtype), b_param = read_scalar(betaParamDiff, g.dtype);
    double *x = read_all(&s, xDesc, xData);
    double *dy = read_all(&s, dyDesc, dyData);
    double *dx_old = b_data != 0.0 ? read_all(&s, dxDesc, dxData) : NULL;
    double *dz_old = (add && b_data != 0.0) ? read_all(&s, dzDesc, dzData) : NULL;
    double *scale = read_all(&s, pdesc, bnScaleData);
    double *dscale_old = b_param != 0.0 ? read_all(&s, pdesc, dBnScaleData) : NULL;
    double *dbias_old = b_param != 0.0 ? read_all(&s, pdesc, dBnBiasData) : NULL;
    double *mean = savedMean ? read_all(&s, pdesc, savedMean) : scratch_doubles(&s, g.groups);
    double *invstd = savedMean ? read_all(&s, pdesc, savedInvVariance) : scratch_doubles(&s, g.groups);
    double *grad = scratch_doubles(&s, g.count);
    double *dx = scratch_doubles(&s, g.count);
    double *dscale = scratch_doubles(&s, g.groups);
    double *dbias = scratch_doubles(&s, g.groups);
    if (!x || !dy || (b_data != 0.0 && !dx_old) || (add && b_data != 0.0 && !dz_old) || !scale ||
        (b_param != 0.0 && (!dscale_old || !dbias_old)) || !mean || !invstd || !grad || !dx || !dscale ||
        !dbias)
        return OOM_FAIL(fn, &s);
    const unsigned char *mask = act ? (const unsigned char *)reserveSpace + RESERVE_HEADER_BYTES : NULL;

    /* --- compute --- */
    scribble(workSpace, workSpaceSizeInBytes);
    if (!savedMean) {            /* no cached stats: recompute them from x */
        batch_stats(&g, x, mean, invstd);
        for (long k = 0; k < g.groups; k++)
            invstd[k] = 1.0 / sqrt(invstd[k] + epsilon);
    }
    normalize_backward(&g, x, dy, mask, mean, invstd, scale, grad, dx, dscale, dbias);
    blend(dx, dx_old, g.count, a_data, b_data);
    if (add)
        blend(grad, dz_old, g.count, a_data, b_data);  /* grad becomes dz */
    blend(dscale, dscale_old, g.groups, a_param, b_param);
    blend(dbias, dbias_old, g.groups, a_param, b_param);

    /* --- write every output --- */
    int ok = write_all(dxDesc, dxData, dx) && write_all(pdesc, dBnScaleData, dscale) &&
             write_all(pdesc, dBnBiasData, dbias);
    if (ok && add)
        ok = write_all(dzDesc, dzData, grad);
    if (!ok)
        return OOM_FAIL(fn, &s);
    scratch_free(&s);
    return CUDNN_STATUS_SUCCESS;
}

/* ======================================================================== */
/* CUDA runtime                                                              */
/* ======================================================================== */

/* Like the real runtime, the sticky "last error" is per thread. */
static _Thread_local cudaError_t t_cuda_last_error = cudaSuccess;

static cudaError_t cuda_result(cudaError_t e)
{
    if (e != cudaSuccess)
        t_cuda_last_error = e;
    return e;
}

#define CUDA_ERR(code, text) {code, #code, text}
static const struct {
    cudaError_t code;
    const char *name, *text;
} g_cuda_errors[] = {
    CUDA_ERR(cudaSuccess, "no error"),
    CUDA_ERR(cudaErrorInvalidValue, "invalid argument"),
    CUDA_ERR(cudaErrorMemoryAllocation, "out of memory"),
    CUDA_ERR(cudaErrorInitializationError, "initialization error"),
    CUDA_ERR(cudaErrorInvalidDevicePointer, "invalid device pointer"),
    CUDA_ERR(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy"),
    CUDA_ERR(cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version"),
    CUDA_ERR(cudaErrorNoDevice, "no CUDA-capable device is detected"),
    CUDA_ERR(cudaErrorInvalidDevice, "invalid device ordinal"),
    CUDA_ERR(cudaErrorIllegalAddress, "an illegal memory access was encountered"),
    CUDA_ERR(cudaErrorInvalidResourceHandle, "invalid resource handle"),
    CUDA_ERR(cudaErrorUnknown, "unknown error"),
};
#undef CUDA_ERR

static int cuda_error_index(cudaError_t e)
{
    for (int i = 0; i < (int)(sizeof g_cuda_errors / sizeof g_cuda_errors[0]); i++)
        if (g_cuda_errors[i].code == e)
            return i;
    return -1;
}

cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)
{
    count_call(__func__);
    if (!runtimeVersion)
        return cuda_result(cudaErrorInvalidValue);
    *runtimeVersion = CUDART_VERSION;
    return cudaSuccess;
}

/* Without a driver the real call succeeds and reports 0. */
cudaError_t cudaDriverGetVersion(int *driverVersion)
{
    count_call(__func__);
    if (!driverVersion)
        return cuda_result(cudaErrorInvalidValue);
    *driverVersion = no_gpu() ? 0 : CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    count_call(__func__);
    if (!count)
        return cuda_result(cudaErrorInvalidValue);
    if (no_gpu()) {
        *count = 0;
        return cuda_result(cudaErrorInsufficientDriver);
    }
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    count_call(__func__);
    if (!device)
        return cuda_result(cudaErrorInvalidValue);
    if (no_gpu())
        return cuda_result(cudaErrorInsufficientDriver);
    *device = 0;                   /* the only device */
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    count_call(__func__);
    if (no_gpu())
        return cuda_result(cudaErrorInsufficientDriver);
    return device == 0 ? cudaSuccess : cuda_result(cudaErrorInvalidDevice);
}

/* Fresh "device" memory is filled with 0xFF bytes, a NaN in every float
 * format, so reading an output that was never written shows up. */
static long g_failing_mallocs;      /* standin_fail_mallocs() */

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    count_call(__func__);
    if (!devPtr)
        return cuda_result(cudaErrorInvalidValue);
    if (no_gpu())
        return cuda_result(cudaErrorInsufficientDriver);
    pthread_mutex_lock(&g_lock);
    int fail_now = g_failing_mallocs > 0;
    g_failing_mallocs -= fail_now;
    pthread_mutex_unlock(&g_lock);
    if (fail_now)
        return cuda_result(cudaErrorMemoryAllocation);
    if (size == 0) {               /* the real runtime hands back NULL */
        *devPtr = NULL;
        return cudaSuccess;
    }
    if (size > SIZE_MAX - DEVICE_ALIGNMENT)
        return cuda_result(cudaErrorMemoryAllocation);
    size_t rounded = (size + DEVICE_ALIGNMENT - 1) / DEVICE_ALIGNMENT * DEVICE_ALIGNMENT;
    void *p = aligned_alloc(DEVICE_ALIGNMENT, rounded);
    if (!p)
        return cuda_result(cudaErrorMemoryAllocation);
    if (!block_add(p, size)) {
        free(p);
        return cuda_result(cudaErrorMemoryAllocation);
    }
    memset(p, 0xFF, size);
    *devPtr = p;
    return cudaSuccess;
}

/* Only pointers returned by cudaMalloc (not interior ones) may be freed. */
cudaError_t cudaFree(void *devPtr)
{
    count_call(__func__);
    if (!devPtr)
        return cudaSuccess;
    if (!block_remove(devPtr))
        return cuda_result(cudaErrorInvalidValue);
    free(devPtr);
    return cudaSuccess;
}

/* Any kind works (host and device memory are the same here), but copies
 * running past the end of a cudaMalloc block are refused. */
static cudaError_t copy_bytes(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    if ((int)kind < (int)cudaMemcpyHostToHost || (int)kind > (int)cudaMemcpyDefault)
        return cuda_result(cudaErrorInvalidMemcpyDirection);
    if (count == 0)
        return cudaSuccess;
    if (!dst || !src)
        return cuda_result(cudaErrorInvalidValue);
    if (bytes_past_block_end(dst, count) || bytes_past_block_end(src, count))
        return cuda_result(cudaErrorInvalidValue);
    memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    count_call(__func__);
    return copy_bytes(dst, src, count, kind);
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
    count_call(__func__);
    if (count == 0)
        return cudaSuccess;
    if (!devPtr || bytes_past_block_end(devPtr, count))
        return cuda_result(cudaErrorInvalidValue);
    memset(devPtr, value, count);
    return cudaSuccess;
}

/* Everything ran synchronously already. */
cudaError_t cudaDeviceSynchronize(void)
{
    count_call(__func__);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    count_call(__func__);
    (void)stream;
    return cudaSuccess;
}

/* cudaMalloc memory (interior pointers included) is device memory on
 * device 0; anything else is unregistered host memory (device -2), which
 * the real runtime also reports with cudaSuccess since CUDA 11. */
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr)
{
    count_call(__func__);
    struct block b;
    if (!attributes)
        return cuda_result(cudaErrorInvalidValue);
    if (ptr && block_find(ptr, &b)) {
        attributes->type = cudaMemoryTypeDevice;
        attributes->device = 0;
        attributes->devicePointer = (void *)ptr;
        attributes->hostPointer = NULL;
    } else {
        attributes->type = cudaMemoryTypeUnregistered;
        attributes->device = -2;
        attributes->devicePointer = NULL;
        attributes->hostPointer = (void *)ptr;
    }
    return cudaSuccess;
}

/* Runs at once (like everything here) but is logged with its stream. */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    count_call(__func__);
    log_line("cudaMemcpyAsync on %p", (void *)stream);
    return copy_bytes(dst, src, count, kind);
}

/* Events are registered objects; recording and waiting only log. */
struct CUevent_st {
    unsigned flags;
};

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    count_call(__func__);
    if (!event || flags > (cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess))
        return cuda_result(cudaErrorInvalidValue);
    if (no_gpu())
        return cuda_result(cudaErrorInsufficientDriver);
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e || !registry_add(e, OBJ_EVENT)) {
        free(e);
        return cuda_result(cudaErrorMemoryAllocation);
    }
    e->flags = flags;
    *event = e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    count_call(__func__);
    if (!event || !registry_has(event, OBJ_EVENT))
        return cuda_result(cudaErrorInvalidResourceHandle);
    log_line("record %p on %p", (void *)event, (void *)stream);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    count_call(__func__);
    if (!event || !registry_has(event, OBJ_EVENT))
        return cuda_result(cudaErrorInvalidResourceHandle);
    if (flags)
        return cuda_result(cudaErrorInvalidValue);
    log_line("wait %p for %p", (void *)stream, (void *)event);
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    count_call(__func__);
    if (!event || !registry_remove(event, OBJ_EVENT))
        return cuda_result(cudaErrorInvalidResourceHandle);
    free(event);
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t error)
{
    count_call(__func__);
    int i = cuda_error_index(error);
    return i >= 0 ? g_cuda_errors[i].text : "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t error)
{
    count_call(__func__);
    int i = cuda_error_index(error);
    return i >= 0 ? g_cuda_errors[i].name : "unrecognized error code";
}

/* Returns the last error of this thread and resets it to cudaSuccess. */
cudaError_t cudaGetLastError(void)
{
    count_call(__func__);
    cudaError_t e = t_cuda_last_error;
    t_cuda_last_error = cudaSuccess;
    return e;
}

/* ======================================================================== */
/* Test hooks                                                                */
/* ======================================================================== */

/* Calls of the named function since load or the last standin_reset();
 * -1 if the name is not one of ours (catches typos in tests). */
long standin_calls(const char *name)
{
    int i = name ? fn_index(name) : -1;
    if (i < 0)
        return -1;
    pthread_mutex_lock(&g_lock);
    long n = g_fn_calls[i];
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* Zeroes the call counters and the last workspace/reserve sizes (live
 * allocations and objects are state, not counters, and are kept). */
void standin_reset(void)
{
    pthread_mutex_lock(&g_lock);
    memset(g_fn_calls, 0, sizeof g_fn_calls);
    g_last_workspace = g_last_reserve = 0;
    pthread_mutex_unlock(&g_lock);
}

long standin_live_allocations(void)
{
    pthread_mutex_lock(&g_lock);
    long n = (long)g_n_blocks;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* Live handles/descriptors/events of one kind: "handle", "tensor",
 * "activation", "event";
 * -1 for any other name. */
long standin_live_objects(const char *kind)
{
    obj_kind_t k;
    if (kind && strcmp(kind, "handle") == 0)
        k = OBJ_HANDLE;
    else if (kind && strcmp(kind, "tensor") == 0)
        k = OBJ_TENSOR;
    else if (kind && strcmp(kind, "activation") == 0)
        k = OBJ_ACTIVATION;
    else if (kind && strcmp(kind, "event") == 0)
        k = OBJ_EVENT;
    else
        return -1;
    long n = 0;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_n_objs; i++)
        n += g_objs[i].kind == k;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* Size passed by the last cudnnBatchNormalizationForwardTrainingEx /
 * cudnnBatchNormalizationBackwardEx call (recorded on entry, so failed
 * calls count too): "workspace" or "reserve"; (size_t)-1 for any other
 * name. */
size_t standin_last_size(const char *what)
{
    size_t v = (size_t)-1;
    pthread_mutex_lock(&g_lock);
    if (what && strcmp(what, "workspace") == 0)
        v = g_last_workspace;
    else if (what && strcmp(what, "reserve") == 0)
        v = g_last_reserve;
    pthread_mutex_unlock(&g_lock);
    return v;
}

/* The stream log since the last call (NUL-terminated, truncated to size);
 * returns its full length and clears it. */
size_t standin_take_log(char *buffer, size_t size)
{
    pthread_mutex_lock(&g_lock);
    size_t n = g_log_len;
    if (buffer && size) {
        size_t k = n < size - 1 ? n : size - 1;
        memcpy(buffer, g_log, k);
        buffer[k] = '\0';
    }
    g_log_len = 0;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* The next `count` cudaMalloc calls fail with cudaErrorMemoryAllocation. */
void standin_fail_mallocs(long count)
{
    pthread_mutex_lock(&g_lock);
    g_failing_mallocs = count;
    pthread_mutex_unlock(&g_lock);
}
