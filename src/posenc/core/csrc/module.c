/* posenc.core._kernels: optional compiled loops; without them numpy and torch do the
   same work.

   - table (table.c): the sinusoidal table loop of posenc.core.angles;
   - rotate (rotate.c): the float32 and bfloat16 rotary rotation of
     posenc.families.rotary.apply;
   - attend and attend_backward (attend.c): the float32 attention loop of
     posenc.integration.attention and its gradients;
   - attend_counted and attend_counted_backward (counted.c): CoPE's loop, the
     operand kind "counted";
   - attend_mixed and attend_mixed_backward (mixed.c): DAPE's loop, the operand
     kind "mlp": an MLP over the heads' scores;
   - breaking and breaking_backward (breaking.c): the float32 stick-breaking loop
     of posenc.stick_breaking_attention and its gradients;
   - path_core and path_core_backward (path.c): the float32 chunk core of PaTH
     attention (posenc.integration.attention.path) and its gradients.

   Each of those files documents its function's arguments; common.h holds what
   they share and team.c runs their jobs on threads. This file reads the argument
   sequences that rotate and the attention loops take, and makes the module. */

#include "common.h"

int posenc_read_sizes(PyObject *seq, Py_ssize_t *dst, int n, const char *name) {
    PyObject *fast = PySequence_Fast(seq, name);
    if (fast == NULL) return -1;
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "%s must have %d entries", name, n);
        return -1;
    }
    for (int d = 0; d < n; ++d) {
        dst[d] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast, d));
        if (dst[d] == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    return 0;
}

int posenc_read_layout(PyObject *sizes, int n, PyObject *qstr, PyObject *kstr, PyObject *vstr,
                       int threads, Py_ssize_t *sz, Py_ssize_t *qs, Py_ssize_t *ks,
                       Py_ssize_t *vs, const char *who) {
    if (posenc_read_sizes(sizes, sz, n, "sizes") || posenc_read_sizes(qstr, qs, 3, "q_strides") ||
        posenc_read_sizes(kstr, ks, 3, "k_strides") || posenc_read_sizes(vstr, vs, 3, "v_strides"))
        return -1;
    for (int i = 0; i < n; ++i)
        if (sz[i] < 1) {
            PyErr_Format(PyExc_ValueError, "%s: sizes must be >= 1", who);
            return -1;
        }
    if (sz[1] % sz[2] || threads < 1) {
        PyErr_Format(PyExc_ValueError, "%s: heads must be a multiple of kv heads, threads >= 1",
                     who);
        return -1;
    }
    return 0;
}

int posenc_read_docs(PyObject *docs, const int32_t **qdoc, const int32_t **kdoc) {
    *qdoc = *kdoc = NULL;
    if (docs == Py_None) return 0;
    unsigned long long qp, kp;
    if (!PyArg_ParseTuple(docs, "KK", &qp, &kp)) return -1;
    *qdoc = (const int32_t *)(uintptr_t)qp;
    *kdoc = (const int32_t *)(uintptr_t)kp;
    return 0;
}

static PyMethodDef methods[] = {
    {"table", posenc_table, METH_VARARGS, "The fused table loop (see the module source)."},
    {"rotate", posenc_rotate, METH_VARARGS, "The fused rotary rotation (see the module source)."},
    {"attend", posenc_attend, METH_VARARGS,
     "Flash attention with a relative bias (see the module source)."},
    {"attend_backward", posenc_attend_backward, METH_VARARGS,
     "The gradients of attend (see the module source)."},
    {"attend_counted", posenc_attend_counted, METH_VARARGS,
     "Flash attention with CoPE's counted positions (see the module source)."},
    {"attend_counted_backward", posenc_attend_counted_backward, METH_VARARGS,
     "The gradients of attend_counted (see the module source)."},
    {"attend_mixed", posenc_attend_mixed, METH_VARARGS,
     "Flash attention with scores refined by an MLP over the heads (see the module source)."},
    {"attend_mixed_backward", posenc_attend_mixed_backward, METH_VARARGS,
     "The gradients of attend_mixed (see the module source)."},
    {"breaking", posenc_breaking, METH_VARARGS,
     "Stick-breaking attention (see the module source)."},
    {"breaking_backward", posenc_breaking_backward, METH_VARARGS,
     "The gradients of breaking (see the module source)."},
    {"path_core", posenc_path_core, METH_VARARGS,
     "PaTH attention's chunk core (see the module source)."},
    {"path_core_backward", posenc_path_core_backward, METH_VARARGS,
     "The gradients of path_core (see the module source)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "posenc.core._kernels",
                                    "Optional compiled loops of posenc.core.angles, posenc.rotary.apply and posenc.attention.", -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) {
    posenc_team_init();
    return PyModule_Create(&module);
}
