/* Thread teams that give way when other work holds the cores.
 *
 * An OpenMP parallel region ends only when every thread of its team has
 * run its share.  When other processes keep the cores busy, a worker the
 * OS has not scheduled makes the caller wait a whole scheduler time slice
 * (milliseconds) for a region of microseconds.  So every region a kernel
 * module forks is timed here: setup.py links the modules built by GCC on
 * Linux with -Wl,--wrap=GOMP_parallel, so GCC's call to GOMP_parallel (the
 * fork of each `prange`) lands in __wrap_GOMP_parallel below, which calls
 * the real one (__real_GOMP_parallel) around a body that stamps when each
 * worker starts.  A worker that starts more than LATE_MIN_NS after the
 * fork and more than an eighth of the region's time after it (a worker
 * that did not run when the fork woke it, and lost the team more than a
 * few percent) makes the region late: the team is then capped at half its
 * size for a hold, after which calls probe the next size up.  Each late
 * region doubles the next hold (HOLD_MIN_NS up to HOLD_MAX_NS), and only
 * CALM_NS without a late region brings it back to HOLD_MIN_NS: one probe
 * that starts on time proves little, as a worker that slept through the
 * hold is woken ahead of the busy work, and the next region finds it
 * spinning among the other processes' threads.
 * The state is process-wide (cn_team_state, owned by _runtime; each module
 * binds to it at import, cn_team_bind).
 *
 * The kernels' blocks never depend on the team's size, so neither do the
 * bits: a capped team computes what the full one would.
 *
 * Elsewhere (MSVC, clang's libomp, builds without OpenMP) CN_TEAM_WRAP is
 * 0: teams are always as asked, and cn_team_threads returns its argument.
 */
#ifndef CN_TEAM_H
#define CN_TEAM_H

#include <stdint.h>

#ifndef CN_TEAM_WRAP
#define CN_TEAM_WRAP 0
#endif

#define CN_TEAM_LATE_MIN_NS 100000          /* 100 us: far above a spinning worker's start */
#define CN_TEAM_HOLD_MIN_NS 10000000        /* 10 ms */
#define CN_TEAM_HOLD_MAX_NS 1280000000      /* 1.28 s: 10 ms doubled 7 times */
#define CN_TEAM_CALM_NS CN_TEAM_HOLD_MAX_NS

typedef struct cn_team_state {
    int64_t held_until;     /* monotonic ns until which teams stay capped */
    int64_t hold_ns;        /* the next hold's length */
    int64_t worker_delay_ns; /* tests: each worker sleeps this long first */
    int64_t regions;        /* regions timed (teams of two or more) */
    int64_t late_regions;   /* ... of which a worker started late */
    int64_t last_late;      /* monotonic ns of the last late region */
    int cap;                /* most threads a team gets; 0: no cap */
    int probe_woke;         /* a probe's first region was late: the next judges */
    int adaptive;           /* 0: teams as asked (set_team_policy) */
} cn_team_state;

/* the process's state, as each module sees it (NULL until cn_team_bind) */
static cn_team_state* cn_team = NULL;

static void cn_team_bind(cn_team_state* state) { cn_team = state; }

static int cn_team_wrapped(void) { return CN_TEAM_WRAP; }

#if CN_TEAM_WRAP

#include <time.h>
#include <omp.h>

#define CN_LOAD(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define CN_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)

static inline int64_t cn_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The threads a team asked for n gets now: n under no cap; the cap while a
 * hold lasts; after it, one step up (a probe). */
static inline int cn_team_threads(int n)
{
    const cn_team_state* s = cn_team;
    int cap;
    if (n <= 1 || s == NULL || !CN_LOAD(&s->adaptive))
        return n;
    cap = CN_LOAD(&s->cap);
    if (cap == 0 || n <= cap)
        return n;
    if (cn_now_ns() < CN_LOAD(&s->held_until))
        return cap;
    return n < 2 * cap ? n : 2 * cap;
}

/* After a region of nt threads: a late one caps the team at half and holds
 * it there, doubling the next hold; an on-time one above the cap (a probe)
 * raises the cap to nt; CALM_NS after the last late region, the next hold
 * is the shortest again.  A probe's first region is not judged when late:
 * its workers slept through the hold, and waking a sleeping thread can
 * take milliseconds on a VM whose idle vCPU the host must schedule first;
 * the probe's next region, with the workers awake, decides. */
static void cn_team_observe(cn_team_state* s, int nt, int late, int64_t now)
{
    int64_t hold;
    int cap = CN_LOAD(&s->cap);
    int probe = cap != 0 && nt > cap;
    __atomic_fetch_add(&s->regions, 1, __ATOMIC_RELAXED);
    if (late && probe && !CN_LOAD(&s->probe_woke)) {
        CN_STORE(&s->probe_woke, 1);
        return;
    }
    CN_STORE(&s->probe_woke, 0);
    if (late) {
        __atomic_fetch_add(&s->late_regions, 1, __ATOMIC_RELAXED);
        hold = CN_LOAD(&s->hold_ns);
        CN_STORE(&s->last_late, now);
        CN_STORE(&s->cap, nt / 2 > 1 ? nt / 2 : 1);
        CN_STORE(&s->held_until, now + hold);
        CN_STORE(&s->hold_ns, 2 * hold < CN_TEAM_HOLD_MAX_NS ? 2 * hold : CN_TEAM_HOLD_MAX_NS);
    } else if (probe) {
        CN_STORE(&s->cap, nt);
    } else if (CN_LOAD(&s->hold_ns) != CN_TEAM_HOLD_MIN_NS
               && now - CN_LOAD(&s->last_late) > CN_TEAM_CALM_NS) {
        CN_STORE(&s->hold_ns, (int64_t)CN_TEAM_HOLD_MIN_NS);
    }
}

typedef struct {
    void (*fn)(void*);
    void* data;
    int64_t start;          /* when the caller forked */
    int64_t latest;         /* the latest worker's start, after `start` */
    int64_t worker_delay_ns;
} cn_region;

static void cn_region_body(void* p)
{
    cn_region* r = (cn_region*)p;
    if (omp_get_thread_num() != 0) {
        int64_t late, seen;
        if (r->worker_delay_ns > 0) {       /* tests: a worker scheduled late */
            struct timespec ts = {(time_t)(r->worker_delay_ns / 1000000000),
                                  (long)(r->worker_delay_ns % 1000000000)};
            nanosleep(&ts, NULL);
        }
        late = cn_now_ns() - r->start;
        seen = __atomic_load_n(&r->latest, __ATOMIC_RELAXED);
        while (late > seen && !__atomic_compare_exchange_n(&r->latest, &seen, late, 1,
                                                           __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            ;
    }
    r->fn(r->data);
}

void __real_GOMP_parallel(void (*fn)(void*), void* data, unsigned nthreads, unsigned flags);

__attribute__((visibility("hidden")))
void __wrap_GOMP_parallel(void (*fn)(void*), void* data, unsigned nthreads, unsigned flags)
{
    cn_team_state* s = cn_team;
    cn_region r;
    int64_t end;
    int nt;
    if (s == NULL || !CN_LOAD(&s->adaptive)) {
        __real_GOMP_parallel(fn, data, nthreads, flags);
        return;
    }
    /* 0: the default team; a call that chose its size before a hold began
     * gets the capped one (OpenMP code must work with fewer threads) */
    nt = cn_team_threads(nthreads == 0 ? omp_get_max_threads() : (int)nthreads);
    if (nt <= 1) {
        __real_GOMP_parallel(fn, data, 1, flags);
        return;
    }
    r.fn = fn;
    r.data = data;
    r.latest = 0;
    r.worker_delay_ns = CN_LOAD(&s->worker_delay_ns);
    r.start = cn_now_ns();
    __real_GOMP_parallel(cn_region_body, &r, (unsigned)nt, flags);
    end = cn_now_ns();
    /* late: a worker not running when the fork woke it (more than
     * LATE_MIN_NS), and long enough to cost the region an eighth of its time */
    cn_team_observe(s, nt, r.latest > CN_TEAM_LATE_MIN_NS && 8 * r.latest > end - r.start,
                    end);
}

#else   /* !CN_TEAM_WRAP */

static inline int cn_team_threads(int n) { return n; }

#endif

#endif
