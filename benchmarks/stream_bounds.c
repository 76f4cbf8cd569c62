/* What a normalization forward can reach on this machine's memory: the
 * simplest loops with the traffic of one, timed on cold 256 MiB arrays.
 *
 *   cc -O3 -march=native -fopenmp stream_bounds.c -o stream_bounds
 *   OMP_NUM_THREADS=1 ./stream_bounds [block_bytes ...]
 *
 * Prints the best GB/s of 10 runs, counting the bytes each loop must move
 * (inputs read once, outputs written once), for:
 *   triad      a = b + s*c, cached stores (24 bytes an element, as STREAM
 *              counts them; the stores' line reads are not counted)
 *   triad_nt   the same with streamed (non-temporal) stores
 *   scale_nt   y = k*x + t over float32 with streamed stores: a one-pass
 *              normalize, 8 bytes an element
 *   twopass_nt for each block size given (default 16 KiB, 160 KiB and
 *              5 MiB): the block summed, then read again and scaled into
 *              streamed stores, block after block: a two-pass normalize
 *              whose unit (a row, a group, an instance, a channels-last
 *              sample) is that size; counted as 8 bytes an element, like
 *              scale_nt.
 *   twopass_ahead_nt  the same, with the next block read into L2 while
 *              this one is stored: a prefetch of its same 1 KiB after each
 *              1 KiB scaled (the read-ahead of cynorm's row norms), so the
 *              reads overlap the stores.
 *   twopass_bf16_nt  the same over bfloat16 (read as float32, summed in
 *              float32, rounded back by AVX512-BF16), 4 bytes an element;
 *              only where the build has AVX512-BF16; and twopass_bf16_ahead_nt,
 *              with twopass_ahead_nt's read-ahead.
 * A unit that fits the core's L2 is read again from it; a larger one is read
 * again from L3 (or DRAM), which is the gap between twopass_nt and scale_nt.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>
#define LANES 16
#elif defined(__x86_64__) && defined(__AVX__)
#include <immintrin.h>
#define LANES 8
#elif defined(__x86_64__)
#include <emmintrin.h>
#define LANES 4
#else
#define LANES 1     /* no streamed stores here: the _nt loops store through the caches */
#endif

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* y[0:n] = k*x + t with streamed stores where the build has them; y 64-byte
 * aligned, n a multiple of 16 */
static void scale_nt(float *restrict y, const float *restrict x, long n, float k, float t) {
#if LANES == 16
    __m512 vk = _mm512_set1_ps(k), vt = _mm512_set1_ps(t);
    for (long i = 0; i < n; i += 16)
        _mm512_stream_ps(y + i, _mm512_fmadd_ps(_mm512_loadu_ps(x + i), vk, vt));
#elif LANES == 8
    __m256 vk = _mm256_set1_ps(k), vt = _mm256_set1_ps(t);
    for (long i = 0; i < n; i += 8)
        _mm256_stream_ps(y + i, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vk), vt));
#elif LANES == 4
    __m128 vk = _mm_set1_ps(k), vt = _mm_set1_ps(t);
    for (long i = 0; i < n; i += 4)
        _mm_stream_ps(y + i, _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(x + i), vk), vt));
#else
    for (long i = 0; i < n; i++)
        y[i] = k * x[i] + t;
#endif
}

static void triad_nt(double *restrict a, const double *restrict b, const double *restrict c,
                     long n, double s) {
#if LANES == 16
    __m512d vs = _mm512_set1_pd(s);
    for (long i = 0; i < n; i += 8)
        _mm512_stream_pd(a + i, _mm512_fmadd_pd(_mm512_loadu_pd(c + i), vs, _mm512_loadu_pd(b + i)));
#elif LANES == 8
    __m256d vs = _mm256_set1_pd(s);
    for (long i = 0; i < n; i += 4)
        _mm256_stream_pd(a + i, _mm256_add_pd(_mm256_mul_pd(_mm256_loadu_pd(c + i), vs),
                                              _mm256_loadu_pd(b + i)));
#elif LANES == 4
    __m128d vs = _mm_set1_pd(s);
    for (long i = 0; i < n; i += 2)
        _mm_stream_pd(a + i, _mm_add_pd(_mm_mul_pd(_mm_loadu_pd(c + i), vs), _mm_loadu_pd(b + i)));
#else
    for (long i = 0; i < n; i++)
        a[i] = b[i] + s * c[i];
#endif
}

/* float32 elements scaled before each prefetch of the next block's same
 * elements (1 KiB; 2 * AHEAD_PIECE bfloat16 elements) */
#define AHEAD_PIECE 256L

#if LANES == 16 && defined(__AVX512BF16__)
#define HAVE_BF16 1
/* bfloat16 block: sum in float32, then y = k*x + t rounded to bfloat16 and
 * streamed; n a multiple of 32, y 64-byte aligned.  With `next`, the next
 * block's same 1 KiB is prefetched into L2 after each 1 KiB stored. */
static void twopass_bf16_block(unsigned short *y, const unsigned short *x, long n,
                               const unsigned short *next) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    for (long i = 0; i < n; i += 32) {
        __m512i v = _mm512_loadu_si512(x + i);
        s0 = _mm512_add_ps(s0, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
        s1 = _mm512_add_ps(s1, _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(-65536))));
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    __m512 vk = _mm512_set1_ps(1.0f / (1.0f + s * s)), vt = _mm512_set1_ps(s);
    for (long i = 0; i < n; i += 32) {
        __m512 a = _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256((const __m256i *)(x + i)));
        __m512 b = _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256((const __m256i *)(x + i + 16)));
        __m512bh r = _mm512_cvtne2ps_pbh(_mm512_fmadd_ps(b, vk, vt), _mm512_fmadd_ps(a, vk, vt));
        _mm512_stream_si512((void *)(y + i), (__m512i)r);
        if (next && (i + 32) % (2 * AHEAD_PIECE) == 0)
            for (long line = i + 32 - 2 * AHEAD_PIECE; line < i + 32; line += 32)
                __builtin_prefetch(next + line, 0, 2);
    }
}
#endif

/* the streamed stores done before the clock stops */
static void fence(void) {
#if LANES > 1
    _mm_sfence();
#endif
}

/* elements a thread's loop takes at a time (static schedule: each thread
 * one contiguous range of pieces) */
#define PIECE 4096L

static float block_sum(const float *x, long n) {
    float acc[16] = {0};
    for (long i = 0; i < n; i += 16)
        for (int l = 0; l < 16; l++)
            acc[l] += x[i + l];
    float s = 0;
    for (int l = 0; l < 16; l++)
        s += acc[l];
    return s;
}

/* every thread's blocks of `block` floats: summed, then scaled; with
 * `ahead`, the next block read into L2 as this one is stored, AHEAD_PIECE
 * elements at a time (block a multiple of it; a thread's last block
 * prefetches the next thread's first, one block in each thread's range) */
static void twopass_nt(float *y, const float *x, long n, long block, int ahead) {
    long nblocks = n / block;
    #pragma omp parallel for schedule(static)
    for (long j = 0; j < nblocks; j++) {
        const float *xj = x + j * block;
        float s = block_sum(xj, block), k = 1.0f / (1.0f + s * s);
        if (!ahead) {
            scale_nt(y + j * block, xj, block, k, s);
            continue;
        }
        for (long i = 0; i < block; i += AHEAD_PIECE) {
            scale_nt(y + j * block + i, xj + i, AHEAD_PIECE, k, s);
            if (j + 1 < nblocks)
                for (long line = 0; line < AHEAD_PIECE; line += 16)
                    __builtin_prefetch(xj + block + i + line, 0, 2);
        }
    }
    fence();
}

#define RUNS 10
#define EVICT_BYTES (768L << 20)     /* beyond the largest last-level caches */

/* a pass over a buffer larger than the caches, each line written: every
 * timed run starts with cold caches (a large L3 would keep a 256 MiB input) */
static void evict(char *buf) {
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < EVICT_BYTES; i += 64) buf[i] += 1;
}

/* what one timed loop reads and writes: n elements, in blocks of `block` */
struct job {
    double *a, *b, *c;
    float *x, *y;
    long n, block;
};

static void run_triad(const struct job *j) {
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < j->n; i++) j->a[i] = j->b[i] + 3.0 * j->c[i];
}

static void run_triad_nt(const struct job *j) {
    #pragma omp parallel for schedule(static)
    for (long k = 0; k < j->n / PIECE; k++)
        triad_nt(j->a + k * PIECE, j->b + k * PIECE, j->c + k * PIECE, PIECE, 3.0);
    fence();
}

static void run_scale_nt(const struct job *j) {
    #pragma omp parallel for schedule(static)
    for (long k = 0; k < j->n / PIECE; k++)
        scale_nt(j->y + k * PIECE, j->x + k * PIECE, PIECE, 0.5f, 1.0f);
    fence();
}

static void run_twopass_nt(const struct job *j) {
    twopass_nt(j->y, j->x, j->n, j->block, 0);
}

static void run_twopass_ahead_nt(const struct job *j) {
    twopass_nt(j->y, j->x, j->n, j->block, 1);
}

#ifdef HAVE_BF16
/* the float32 arrays as bfloat16 storage */
static void twopass_bf16_nt(const struct job *j, int ahead) {
    unsigned short *xb = (unsigned short *)j->x, *yb = (unsigned short *)j->y;
    long nblocks = j->n / j->block;
    #pragma omp parallel for schedule(static)
    for (long k = 0; k < nblocks; k++)
        twopass_bf16_block(yb + k * j->block, xb + k * j->block, j->block,
                           ahead && k + 1 < nblocks ? xb + (k + 1) * j->block : NULL);
    fence();
}

static void run_twopass_bf16_nt(const struct job *j) {
    twopass_bf16_nt(j, 0);
}

static void run_twopass_bf16_ahead_nt(const struct job *j) {
    twopass_bf16_nt(j, 1);
}
#endif

/* the best GB/s of RUNS cold-cache runs of `run`, counting `bytes` */
static double best_gbs(void (*run)(const struct job *), const struct job *j, double bytes,
                       char *ev) {
    double best = 1e30;
    for (int r = 0; r < RUNS; r++) {
        evict(ev);
        double t = now();
        run(j);
        t = now() - t;
        if (t < best) best = t;
    }
    return bytes / best / 1e9;
}

int main(int argc, char **argv) {
    const long nd = (256L << 20) / 8, nf = (256L << 20) / 4;
    double *a = aligned_alloc(64, nd * 8), *b = aligned_alloc(64, nd * 8),
           *c = aligned_alloc(64, nd * 8);
    float *x = aligned_alloc(64, nf * 4), *y = aligned_alloc(64, nf * 4);
    char *ev = calloc(EVICT_BYTES, 1);
    if (!a || !b || !c || !x || !y || !ev) return 1;
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < nd; i++) { a[i] = 0.0; b[i] = 1.0; c[i] = 2.0; }
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < nf; i++) { x[i] = (float)(i % 7); y[i] = 0.0f; }
#if LANES == 1
    printf("# no streamed stores in this build: the _nt loops store through the caches\n");
#endif
    struct job j = {a, b, c, x, y, nd, 0};
    printf("triad       %7.2f GB/s\n", best_gbs(run_triad, &j, 24.0 * nd, ev));
    printf("triad_nt    %7.2f GB/s\n", best_gbs(run_triad_nt, &j, 24.0 * nd, ev));
    j.n = nf;
    printf("scale_nt    %7.2f GB/s\n", best_gbs(run_scale_nt, &j, 8.0 * nf, ev));

    long sizes[16] = {16L << 10, 160L << 10, 5L << 20};
    int nsizes = 3;
    if (argc > 1) {
        nsizes = 0;
        for (int i = 1; i < argc && nsizes < 16; i++) sizes[nsizes++] = atol(argv[i]);
    }
    for (int s = 0; s < nsizes; s++) {
        j.block = (sizes[s] / 4) & ~15L;
        if (j.block < 16) continue;
        j.n = nf / j.block * j.block;
        printf("twopass_nt  %7.2f GB/s  (unit %ld KiB)\n",
               best_gbs(run_twopass_nt, &j, 8.0 * j.n, ev), j.block * 4 >> 10);
        if (j.block % AHEAD_PIECE == 0)
            printf("twopass_ahead_nt %7.2f GB/s  (unit %ld KiB)\n",
                   best_gbs(run_twopass_ahead_nt, &j, 8.0 * j.n, ev), j.block * 4 >> 10);
    }
#ifdef HAVE_BF16
    for (int s = 0; s < nsizes; s++) {         /* twice the elements in 16 bits */
        j.block = (sizes[s] / 2) & ~31L;
        if (j.block < 32) continue;
        j.n = 2 * nf / j.block * j.block;
        printf("twopass_bf16_nt %7.2f GB/s  (unit %ld KiB)\n",
               best_gbs(run_twopass_bf16_nt, &j, 4.0 * j.n, ev), j.block * 2 >> 10);
        if (j.block % (2 * AHEAD_PIECE) == 0)
            printf("twopass_bf16_ahead_nt %7.2f GB/s  (unit %ld KiB)\n",
                   best_gbs(run_twopass_bf16_ahead_nt, &j, 4.0 * j.n, ev), j.block * 2 >> 10);
    }
#endif
    return y[nf / 3] == 12345.0f ? 2 : 0;
}
