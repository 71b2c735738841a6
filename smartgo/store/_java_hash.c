/* Java's String.hashCode over ASCII bytes, for the dispatch hot path: a tag's ConsumeQueue code
 * and an index key's slot (topic#key). smartgo/store/java_hash.py is the reference and handles
 * everything else (text that is not ASCII is hashed over its UTF-16 units there). In Python the
 * hash of a 32-byte UNIQ_KEY was a third of a dispatched record's cost in rounds too small for
 * the numpy path (the synchronous sends' case). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ascii_hash(data, seed=0) -> (seed * 31**len(data) + hash(data)) mod 2**32: the hash of
 * prefix + data when seed is the prefix's; None when data is not all ASCII. */
static PyObject *ascii_hash(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer view;
    unsigned long long seed = 0;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "ascii_hash(data, seed=0)");
        return NULL;
    }
    if (nargs == 2) {
        seed = PyLong_AsUnsignedLongLongMask(args[1]);
        if (seed == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    if (view.itemsize != 1 || (view.format != NULL && strcmp(view.format, "B") && strcmp(view.format, "b") &&
                               strcmp(view.format, "c"))) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "ascii_hash takes bytes");
        return NULL;
    }
    const unsigned char *p = view.buf, *end = p + view.len;
    uint32_t h = (uint32_t)seed;
    unsigned char high = 0;
    for (; p < end; p++) {
        h = h * 31u + *p;
        high |= *p;
    }
    PyBuffer_Release(&view);
    if (high & 0x80)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(h);
}

static PyMethodDef methods[] = {
    {"ascii_hash", (PyCFunction)(void (*)(void))ascii_hash, METH_FASTCALL,
     "ascii_hash(data, seed=0) -> Java hashCode of ASCII bytes continued from seed, mod 2**32; None if not ASCII"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_java_hash", NULL, -1, methods};

PyMODINIT_FUNC PyInit__java_hash(void) { return PyModule_Create(&module); }
