/* The module's functions (see native.h for what each file does). */
#include "native.h"

static PyMethodDef methods[] = {
    {"read_mask", read_mask, METH_VARARGS, read_mask_doc},
    {"coded", coded, METH_VARARGS, coded_doc},
    {"changes", changes, METH_O, changes_doc},
    {"token_types", token_types, METH_VARARGS, token_types_doc},
    {"compile_layout", compile_layout, METH_VARARGS, compile_layout_doc},
    {"find_items", find_items, METH_VARARGS, find_items_doc},
    {"place_items", place_items, METH_VARARGS, place_items_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "The loops over every token of a CPU batch, compiled.", -1, methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    PyObject *created = PyModule_Create(&module);
    if (created && PyModule_AddIntConstant(created, "MAX_MEDIA_TOKENS", MAX_MEDIA_TOKENS) < 0)
        Py_CLEAR(created);
    return created;
}
