/* Threads for the quantized products (qmatmul.c).
 *
 * lk_pool_run(fn, ctx, parts) runs fn(ctx, 0, parts) .. fn(ctx, parts - 1, parts)
 * and returns when all have finished.
 *
 * Where an OpenMP runtime is already loaded in the process (torch's libgomp, or
 * libiomp / libomp), the parts run on its team through GOMP_parallel, the entry
 * point `#pragma omp parallel` compiles to: the same threads as torch's own
 * kernels. A second pool beside it would spin against torch's idle OpenMP threads
 * on the same cores (measured on 2 cores: steps of 100+ ms instead of 12).
 *
 * Otherwise a small pool of our own: part 0 on the calling thread, the others on
 * workers started on first use. Between jobs a worker spins briefly (a verify
 * forward calls the pool ~120 times, tens of microseconds apart), yielding the
 * core to other runnable threads, then sleeps on a condition variable. A forked
 * child starts with no workers and makes its own. */
#ifndef LK_QPOOL_H
#define LK_QPOOL_H

typedef void (*lk_task_fn)(void *ctx, int part, int parts);

#define LK_POOL_MAX_THREADS 64

/* Returns LK_OK, or LK_ENOMEM when no worker could be started (then every part ran
 * on the calling thread, so the job is still done). */
int lk_pool_run(lk_task_fn fn, void *ctx, int parts);

/* "openmp" (parts run on the process's OpenMP team) or "threads" (the pool's own workers). */
const char *lk_pool_kind(void);

/* Tests: nonzero runs every job on the pool's own workers, as where no OpenMP runtime is loaded. */
void lk_pool_force_own_threads(int on);

#endif
