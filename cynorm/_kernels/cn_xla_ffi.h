/* The part of XLA's FFI binary interface (the C ABI of
 * xla/ffi/api/c_api.h, major version 0) that cynorm's JAX handlers use,
 * declared here so that building cynorm needs no jaxlib.
 * tests/test_jax_ffi_abi.py compiles these declarations beside jaxlib's
 * header and checks every size, offset and constant.
 *
 * A handler is `void* handler(cn_ffi_frame*)`: it returns NULL on success
 * or an error made by the runtime (cn_ffi_error).  XLA first calls each
 * handler once with a metadata extension and no arguments, to learn the API
 * version it was written for (cn_ffi_metadata_call answers that call). */
#ifndef CN_XLA_FFI_H
#define CN_XLA_FFI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum {
    CN_FFI_EXTENSION_METADATA = 1,
    CN_FFI_STAGE_EXECUTE = 3,
    CN_FFI_BUFFER = 1,              /* the argument and result type of an array */
    CN_FFI_ATTR_SCALAR = 3,
    CN_FFI_INVALID_ARGUMENT = 3,    /* error codes (absl's) */
    CN_FFI_RESOURCE_EXHAUSTED = 8,
    CN_FFI_F16 = 10,                /* element types */
    CN_FFI_F32 = 11,
    CN_FFI_F64 = 12,
    CN_FFI_BF16 = 16,
    CN_FFI_PRED = 1,
    CN_FFI_S32 = 4,
    CN_FFI_S64 = 5,
};

typedef struct cn_ffi_ext {         /* the head of every extension */
    size_t struct_size;
    int type;
    struct cn_ffi_ext* next;
} cn_ffi_ext;

typedef struct {
    size_t struct_size;
    cn_ffi_ext* extension_start;
    int major_version;
    int minor_version;
} cn_ffi_version;

typedef struct {
    size_t struct_size;
    cn_ffi_ext* extension_start;
    const char* message;
    int errc;
} cn_ffi_error_args;

typedef struct {                    /* the runtime's function table (its head) */
    size_t struct_size;
    cn_ffi_ext* extension_start;
    cn_ffi_version api_version;
    const void* internal_api;
    void* (*error_create)(cn_ffi_error_args* args);
} cn_ffi_api;

typedef struct {                    /* an array argument or result */
    size_t struct_size;
    cn_ffi_ext* extension_start;
    int dtype;
    void* data;
    int64_t rank;
    int64_t* dims;
} cn_ffi_buffer;

typedef struct {                    /* the arguments, or the results */
    size_t struct_size;
    cn_ffi_ext* extension_start;
    int64_t size;
    int* types;
    void** items;
} cn_ffi_list;

typedef struct {
    const char* ptr;
    size_t len;
} cn_ffi_bytes;

typedef struct {
    int dtype;
    void* value;
} cn_ffi_scalar;

typedef struct {                    /* the attributes, sorted by name */
    size_t struct_size;
    cn_ffi_ext* extension_start;
    int64_t size;
    int* types;
    cn_ffi_bytes** names;
    void** attrs;
} cn_ffi_attrs;

typedef struct {
    size_t struct_size;
    cn_ffi_ext* extension_start;
    const cn_ffi_api* api;
    void* ctx;
    int stage;
    cn_ffi_list args;
    cn_ffi_list rets;
    cn_ffi_attrs attrs;
} cn_ffi_frame;

typedef struct {
    size_t struct_size;
    cn_ffi_version api_version;
    uint32_t traits;
    int64_t state_type_id;          /* from minor version 2 on (see struct_size) */
} cn_ffi_metadata;

typedef struct {
    cn_ffi_ext extension_base;
    cn_ffi_metadata* metadata;
} cn_ffi_metadata_ext;

/* The API version the handlers report: the runtime accepts only its own, so
 * cynorm.jax sets it from jaxlib's header before registering (0.0: unset,
 * and registration fails). */
static int cn_ffi_major = 0, cn_ffi_minor = 0;

static inline void cn_ffi_claim(int major, int minor) {
    cn_ffi_major = major;
    cn_ffi_minor = minor;
}

/* The metadata call: answers it and returns 1; any other call: 0. */
static inline int cn_ffi_metadata_call(cn_ffi_frame* f) {
    if (f->extension_start == NULL || f->extension_start->type != CN_FFI_EXTENSION_METADATA)
        return 0;
    cn_ffi_metadata* m = ((cn_ffi_metadata_ext*)f->extension_start)->metadata;
    m->api_version.struct_size = sizeof(cn_ffi_version);
    m->api_version.extension_start = NULL;
    m->api_version.major_version = cn_ffi_major;
    m->api_version.minor_version = cn_ffi_minor;
    m->traits = 0;
    if (m->struct_size >= offsetof(cn_ffi_metadata, state_type_id) + sizeof(int64_t))
        m->state_type_id = 0;       /* stateless */
    return 1;
}

/* An error for the runtime to raise: "cynorm.jax.<op>: <message>". */
static inline void* cn_ffi_error(const cn_ffi_frame* f, int code, const char* op,
                                 const char* message) {
    char text[320];
    snprintf(text, sizeof text, "cynorm.jax.%s: %s", op, message);
    cn_ffi_error_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.message = text;               /* copied by the runtime */
    a.errc = code;
    return f->api->error_create(&a);
}

/* Array argument / result i, or NULL (out of range, or not an array). */
static inline cn_ffi_buffer* cn_ffi_arg(const cn_ffi_frame* f, int64_t i) {
    if (i < 0 || i >= f->args.size || f->args.types[i] != CN_FFI_BUFFER) return NULL;
    return (cn_ffi_buffer*)f->args.items[i];
}

static inline cn_ffi_buffer* cn_ffi_ret(const cn_ffi_frame* f, int64_t i) {
    if (i < 0 || i >= f->rets.size || f->rets.types[i] != CN_FFI_BUFFER) return NULL;
    return (cn_ffi_buffer*)f->rets.items[i];
}

static inline int64_t cn_ffi_count(const cn_ffi_buffer* b) {
    int64_t n = 1;
    for (int64_t i = 0; i < b->rank; i++) n *= b->dims[i];
    return n;
}

/* The scalar attribute `name`, or NULL. */
static inline const cn_ffi_scalar* cn_ffi_scalar_attr(const cn_ffi_frame* f, const char* name) {
    size_t len = strlen(name);
    for (int64_t i = 0; i < f->attrs.size; i++) {
        const cn_ffi_bytes* s = f->attrs.names[i];
        if (f->attrs.types[i] == CN_FFI_ATTR_SCALAR && s->len == len
                && memcmp(s->ptr, name, len) == 0)
            return (const cn_ffi_scalar*)f->attrs.attrs[i];
    }
    return NULL;
}

/* A floating-point scalar attribute into *v: 1, or 0 if absent or not one. */
static inline int cn_ffi_float_attr(const cn_ffi_frame* f, const char* name, double* v) {
    const cn_ffi_scalar* s = cn_ffi_scalar_attr(f, name);
    if (s == NULL) return 0;
    if (s->dtype == CN_FFI_F64) { *v = *(const double*)s->value; return 1; }
    if (s->dtype == CN_FFI_F32) { *v = *(const float*)s->value; return 1; }
    return 0;
}

/* An integer (or boolean) scalar attribute into *v: 1, or 0 if absent or not one. */
static inline int cn_ffi_int_attr(const cn_ffi_frame* f, const char* name, int64_t* v) {
    const cn_ffi_scalar* s = cn_ffi_scalar_attr(f, name);
    if (s == NULL) return 0;
    if (s->dtype == CN_FFI_S64) { *v = *(const int64_t*)s->value; return 1; }
    if (s->dtype == CN_FFI_S32) { *v = *(const int32_t*)s->value; return 1; }
    if (s->dtype == CN_FFI_PRED) { *v = *(const uint8_t*)s->value != 0; return 1; }
    return 0;
}

#endif
