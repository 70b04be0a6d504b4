/* Shared by the kernels of posenc.core._kernels (module.c lists them): the includes,
   the CPU feature macros, the size limits, and the helpers defined in team.c
   (running jobs in parallel, launching numbered copies of a job, the backwards'
   per-thread copies of their outputs, mapping in output pages) and module.c (reading
   argument sequences). Every file is built with -ffp-contract=off (setup.py). */

#ifndef POSENC_KERNELS_COMMON_H
#define POSENC_KERNELS_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <dlfcn.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/mman.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

/* Tables larger than this are written with non-temporal stores: they cannot stay in
   cache anyway, and streaming skips reading every destination line first. */
#define STREAM_BYTES ((Py_ssize_t)16 << 20)

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_AVX2_ROW 1
#endif

/* The most leading dims (all but the last) a rotate() input may have. */
#define MAX_LEAD 8

/* Runs fn(jobs[0]), ..., fn(jobs[n - 1]) (each `size` bytes) in parallel, the GIL
   already released: torch's OpenMP team where it is loaded (in the process that
   imported the module, never in a forked child), else POSIX threads (team.c). */
typedef void *(*work_fn)(void *);
void posenc_run_jobs(work_fn fn, void *jobs, int n, size_t size);

/* What every job of a parallel loop starts with: its number among nthreads, and
   whether it failed (ran out of memory). */
typedef struct {
    int tid, nthreads, failed;
} team_job_t;

/* Runs fn on `threads` copies of base (`size` bytes, a team_job_t first), numbered 0 ..
   threads - 1, as posenc_run_jobs does; -1 when out of memory or a job failed, else 0
   (team.c). Needs no GIL. */
int posenc_launch(work_fn fn, const void *base, size_t size, int threads);

/* The copies of an output that the threads of a backward add into, in parallel:
   thread 0's is out itself (zeroed by the caller), every other thread's a zeroed
   buffer of n floats of its own; all NULL where out is (not wanted). NULL when out of
   memory. sum_partials (tiles.h) adds them into out; posenc_partials_free frees
   them (team.c). */
float **posenc_partials(float *out, size_t n, int threads);
void posenc_partials_free(float **each, int threads);

/* Records the importing process, the only one that may join an OpenMP team (team.c);
   called once, by the module's init. */
void posenc_team_init(void);

/* Maps in fresh pages of [p, p + n) with one system call (team.c). */
void posenc_prefault(char *p, Py_ssize_t n);

/* Reads n ints of the sequence seq into dst; -1 with an exception set (naming
   `name`) unless it has exactly n (module.c). */
int posenc_read_sizes(PyObject *seq, Py_ssize_t *dst, int n, const char *name);

/* Reads an attention loop's n >= 7 sizes into sz (B, H, HK, LQ, LK, D, DV, then any of
   its own) and the element strides of q, k and v over their first three dims into qs, ks
   and vs; -1 with an exception naming `who` unless every size is >= 1, H is a multiple
   of HK and threads >= 1 (module.c). */
int posenc_read_layout(PyObject *sizes, int n, PyObject *qstr, PyObject *kstr, PyObject *vstr,
                       int threads, Py_ssize_t *sz, Py_ssize_t *qs, Py_ssize_t *ks,
                       Py_ssize_t *vs, const char *who);

/* Reads the documents of an attention loop: None (both NULL) or (qdoc, kdoc), the
   addresses of int32 (B, LQ) and (B, LK) document numbers; -1 with an exception set
   (module.c). */
int posenc_read_docs(PyObject *docs, const int32_t **qdoc, const int32_t **kdoc);

/* The module's functions (table.c, rotate.c, attend.c, counted.c, mixed.c, breaking.c, path.c). */
PyObject *posenc_table(PyObject *self, PyObject *args);
PyObject *posenc_rotate(PyObject *self, PyObject *args);
PyObject *posenc_attend(PyObject *self, PyObject *args);
PyObject *posenc_attend_backward(PyObject *self, PyObject *args);
PyObject *posenc_attend_counted(PyObject *self, PyObject *args);
PyObject *posenc_attend_counted_backward(PyObject *self, PyObject *args);
PyObject *posenc_attend_mixed(PyObject *self, PyObject *args);
PyObject *posenc_attend_mixed_backward(PyObject *self, PyObject *args);
PyObject *posenc_breaking(PyObject *self, PyObject *args);
PyObject *posenc_breaking_backward(PyObject *self, PyObject *args);
PyObject *posenc_path_core(PyObject *self, PyObject *args);
PyObject *posenc_path_core_backward(PyObject *self, PyObject *args);

#endif
