/* What the kernels share for writing large outputs on several threads: running their
   jobs in parallel, the backwards' per-thread copies of their outputs, and mapping in
   the pages of an output before it is written. */

#include "common.h"

/* Runs fn(jobs[0]), ..., fn(jobs[n - 1]) (each `size` bytes) in parallel, the GIL
   already released.

   Where an OpenMP runtime is loaded already (torch's libgomp, when torch is
   imported), its thread team runs them: those are the threads torch's own
   kernels run on, and after each parallel region they spin for a while waiting
   for more work; threads of our own would share the CPUs with those spinning
   threads and measured here up to 1.4x slower. Otherwise POSIX threads, the
   caller running jobs[0]; a thread that cannot start has its job run here. */
typedef struct {
    work_fn fn;
    char *jobs;
    size_t size;
    int n;
} team_t;

static void (*gomp_parallel)(void (*)(void *), void *, unsigned, unsigned);
static int (*omp_thread_num)(void);
static int (*omp_num_threads)(void);
/* The process that imported the module. Only it may join an OpenMP team: a forked
   child (a DataLoader worker) inherits the parent's team in name only, its threads
   are gone, and joining it waits for them forever. Recorded at import, not at the
   first parallel call: the parent may have run torch's parallel ops and forked
   before posenc ever ran a kernel. */
static pid_t owner_pid;

void posenc_team_init(void) { owner_pid = getpid(); }

static void find_openmp(void) {
#ifdef __linux__
    static int looked = 0;
    if (looked) return;
    looked = 1;
    void *lib = dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD); /* only if loaded */
    if (lib == NULL) return;
    void *par = dlsym(lib, "GOMP_parallel"), *num = dlsym(lib, "omp_get_thread_num");
    void *team = dlsym(lib, "omp_get_num_threads");
    if (par && num && team) {
        *(void **)&gomp_parallel = par;
        *(void **)&omp_thread_num = num;
        *(void **)&omp_num_threads = team;
    }
#endif
}

static void team_body(void *arg) {
    team_t *t = (team_t *)arg;
    /* the team may be smaller than asked (nested regions): stride over the jobs */
    for (int i = omp_thread_num(); i < t->n; i += omp_num_threads()) t->fn(t->jobs + i * t->size);
}

void posenc_run_jobs(work_fn fn, void *jobs, int n, size_t size) {
    char *base = (char *)jobs;
    /* libgomp's team does not survive fork (a DataLoader worker): threads of our own there */
    int owner = n > 1 && getpid() == owner_pid;
    if (owner) find_openmp();
    if (owner && gomp_parallel != NULL) {
        team_t team = {fn, base, size, n};
        gomp_parallel(team_body, &team, (unsigned)n, 0);
        return;
    }
    pthread_t *ids = n > 1 ? (pthread_t *)calloc((size_t)n, sizeof(pthread_t)) : NULL;
    int *started = n > 1 ? (int *)calloc((size_t)n, sizeof(int)) : NULL;
    if (ids == NULL || started == NULL) { /* one job or no memory: all of them here */
        for (int i = 0; i < n; ++i) fn(base + i * size);
    } else {
        for (int i = 1; i < n; ++i) {
            started[i] = pthread_create(&ids[i], NULL, fn, base + i * size) == 0;
            if (!started[i]) fn(base + i * size);
        }
        fn(base);
        for (int i = 1; i < n; ++i)
            if (started[i]) pthread_join(ids[i], NULL);
    }
    free(ids);
    free(started);
}

int posenc_launch(work_fn fn, const void *base, size_t size, int threads) {
    char *jobs = (char *)calloc((size_t)threads, size);
    if (jobs == NULL) return -1;
    for (int i = 0; i < threads; ++i) {
        team_job_t *job = (team_job_t *)(jobs + i * size);
        memcpy(job, base, size);
        job->tid = i;
        job->nthreads = threads;
    }
    posenc_run_jobs(fn, jobs, threads, size);
    int failed = 0;
    for (int i = 0; i < threads; ++i) failed |= ((team_job_t *)(jobs + i * size))->failed;
    free(jobs);
    return failed ? -1 : 0;
}

float **posenc_partials(float *out, size_t n, int threads) {
    float **each = (float **)calloc((size_t)threads, sizeof(float *));
    if (each == NULL || out == NULL) return each;
    each[0] = out;
    for (int i = 1; i < threads; ++i)
        if ((each[i] = (float *)calloc(n, sizeof(float))) == NULL) {
            posenc_partials_free(each, threads);
            return NULL;
        }
    return each;
}

void posenc_partials_free(float **each, int threads) {
    for (int i = 1; each && i < threads; ++i) free(each[i]);
    free(each);
}

/* Maps in fresh pages of [p, p + n) with one system call instead of a page fault per
   page (Linux 5.14+; elsewhere, or on failure, the first writes fault them in). */
void posenc_prefault(char *p, Py_ssize_t n) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
    static long page = 0;
    if (page == 0) page = sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    uintptr_t b = ((uintptr_t)p + (uintptr_t)n) & ~((uintptr_t)page - 1);
    if (b > a) (void)madvise((void *)a, b - a, MADV_POPULATE_WRITE);
#else
    (void)p;
    (void)n;
#endif
}
