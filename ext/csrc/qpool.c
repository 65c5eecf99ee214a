/* See qpool.h. */
#define _GNU_SOURCE
#include "qpool.h"

#include <dlfcn.h>
#ifdef __linux__
#include <link.h>
#endif
#include <pthread.h>
#include <string.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "lk_common.h"

/* How long an idle worker keeps polling for the next job before it sleeps. */
#define SPIN_NS 200000L

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_cv = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t run_mu = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */
static int n_workers;               /* started workers (part i runs on worker i - 1) */
static atomic_long generation;      /* bumped once per job */
static atomic_int remaining;        /* workers that have not yet answered the current job */
static int sleepers;                /* workers waiting on pool_cv (under pool_mu) */
static lk_task_fn job_fn;
static void *job_ctx;
static int job_parts;
static int atfork_set;
static long created_gen; /* the generation when the newest worker was started (read by it) */

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void *worker(void *arg) {
    int me = (int)(long)arg; /* runs part me + 1 */
    long seen = created_gen; /* not the live value: a job may start before this thread runs */
    for (;;) {
        long start = now_ns();
        unsigned spins = 0;
        while (atomic_load_explicit(&generation, memory_order_acquire) == seen) {
            if (++spins % 64 == 0) {
                if (now_ns() - start > SPIN_NS) {
                    pthread_mutex_lock(&pool_mu);
                    sleepers++;
                    while (atomic_load(&generation) == seen) pthread_cond_wait(&pool_cv, &pool_mu);
                    sleepers--;
                    pthread_mutex_unlock(&pool_mu);
                    break;
                }
                sched_yield(); /* let a runnable thread of this core (torch's own) go first */
            }
        }
        seen = atomic_load(&generation);
        /* Every worker answers every job (a spare one with nothing to run), so the
         * job's fields are not rewritten for the next job while one still reads them. */
        if (me + 1 < job_parts) job_fn(job_ctx, me + 1, job_parts);
        atomic_fetch_sub_explicit(&remaining, 1, memory_order_release);
    }
    return NULL;
}

static void after_fork_child(void) {
    /* The child has only the forking thread: the workers are gone. */
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    pool_mu = mu;
    run_mu = mu;
    pool_cv = cv;
    n_workers = 0;
    sleepers = 0;
}

static int ensure_workers(int want) {
    if (!atfork_set) {
        pthread_atfork(NULL, NULL, after_fork_child);
        atfork_set = 1;
    }
    while (n_workers < want) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        created_gen = atomic_load(&generation);
        int rc = pthread_create(&t, &attr, worker, (void *)(long)n_workers);
        pthread_attr_destroy(&attr);
        if (rc != 0) return LK_ENOMEM;
        n_workers++;
    }
    return LK_OK;
}

/* ---- the OpenMP runtime already in the process (torch's), found by name among the loaded objects ---- */

typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);
static gomp_parallel_fn gomp_parallel;
static int (*omp_thread_num)(void);
static int (*omp_num_threads)(void);
static int omp_looked;
static int own_threads_forced; /* tests: use the pool's own workers even where OpenMP is loaded */

#ifdef __linux__
static int find_omp(struct dl_phdr_info *info, size_t size, void *found) {
    (void)size;
    const char *name = info->dlpi_name, *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (strncmp(base, "libgomp", 7) && strncmp(base, "libiomp", 7) && strncmp(base, "libomp", 6)) return 0;
    void *h = dlopen(name, RTLD_LAZY | RTLD_NOLOAD); /* already loaded: only a handle, no second copy */
    if (!h) return 0;
    gomp_parallel_fn par = (gomp_parallel_fn)dlsym(h, "GOMP_parallel");
    int (*num)(void) = (int (*)(void))dlsym(h, "omp_get_thread_num");
    int (*count)(void) = (int (*)(void))dlsym(h, "omp_get_num_threads");
    if (!par || !num || !count) return 0;
    gomp_parallel = par;
    omp_thread_num = num;
    omp_num_threads = count;
    *(int *)found = 1;
    return 1;
}
#endif

typedef struct {
    lk_task_fn fn;
    void *ctx;
    int parts;
} omp_job;

static void omp_body(void *arg) {
    const omp_job *j = arg;
    int me = omp_thread_num(), team = omp_num_threads();
    for (int p = me; p < j->parts; p += team) j->fn(j->ctx, p, j->parts); /* a smaller team than asked still runs all */
}

void lk_pool_force_own_threads(int on) { own_threads_forced = on; }

const char *lk_pool_kind(void) {
    if (own_threads_forced) return "threads";
    if (!omp_looked) {
#ifdef __linux__
        int found = 0;
        dl_iterate_phdr(find_omp, &found); /* elsewhere: our own threads */
#endif
        omp_looked = 1;
    }
    return gomp_parallel ? "openmp" : "threads";
}

int lk_pool_run(lk_task_fn fn, void *ctx, int parts) {
    if (parts > LK_POOL_MAX_THREADS) parts = LK_POOL_MAX_THREADS;
    if (parts <= 1) {
        fn(ctx, 0, 1);
        return LK_OK;
    }
    if (lk_pool_kind()[0] == 'o') {
        /* The team torch's own kernels use: no second set of threads spinning against it. */
        omp_job j = {fn, ctx, parts};
        gomp_parallel(omp_body, &j, (unsigned)parts, 0);
        return LK_OK;
    }
    pthread_mutex_lock(&run_mu);
    int rc = ensure_workers(parts - 1);
    if (rc != LK_OK) {
        pthread_mutex_unlock(&run_mu);
        for (int p = 0; p < parts; p++) fn(ctx, p, parts);
        return rc;
    }
    job_fn = fn;
    job_ctx = ctx;
    job_parts = parts;
    /* Workers beyond this job's parts see the new generation, run nothing and answer. */
    atomic_store(&remaining, n_workers);
    pthread_mutex_lock(&pool_mu);
    atomic_fetch_add_explicit(&generation, 1, memory_order_release);
    if (sleepers) pthread_cond_broadcast(&pool_cv);
    pthread_mutex_unlock(&pool_mu);
    fn(ctx, 0, parts);
    unsigned spins = 0;
    while (atomic_load_explicit(&remaining, memory_order_acquire) > 0)
        if (++spins % 64 == 0) sched_yield();
    pthread_mutex_unlock(&run_mu);
    return LK_OK;
}
