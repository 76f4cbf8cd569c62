/* STREAM-style triad a[i] = b[i] + s * c[i] on three 256 MiB float64 arrays,
 * OpenMP threads as set by OMP_NUM_THREADS.  Prints the best GB/s of 10 runs
 * counting 24 bytes per element (two reads, one write), as STREAM does. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(void) {
    const long n = (256L << 20) / 8;
    double *a = malloc(n * 8), *b = malloc(n * 8), *c = malloc(n * 8);
    if (!a || !b || !c) return 1;
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) { a[i] = 0.0; b[i] = 1.0; c[i] = 2.0; }
    double best = 1e30, s = 3.0;
    for (int r = 0; r < 10; r++) {
        double t = now();
        #pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
        t = now() - t;
        if (t < best) best = t;
    }
    printf("%.3f\n", 24.0 * n / best / 1e9);
    return a[n / 2] == 7.0 ? 0 : 2;
}
