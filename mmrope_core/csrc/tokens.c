/* Reading token ids: each id's media type, and how often a token occurs. */
#include "native.h"

#include <string.h>

/* The ids of one worker's rows in blocks that stay in the first-level cache, each block read
 * once per media token by a loop the compiler turns into vector compares. */
#define TYPE_BLOCK 512

#define TYPE_ROWS(NAME, ID)                                                                    \
VECTOR_CLONES void                                                                             \
NAME(const ID *restrict ids, int8_t *restrict types, Py_ssize_t first, Py_ssize_t end,        \
     const int64_t *token, const int8_t *type, Py_ssize_t count)                               \
{                                                                                              \
    for (Py_ssize_t block = first; block < end; block += TYPE_BLOCK) {                         \
        const Py_ssize_t stop = end - block < TYPE_BLOCK ? end : block + TYPE_BLOCK;           \
        memset(types + block, 0, (size_t)(stop - block));                                      \
        for (Py_ssize_t k = 0; k < count; k++) {                                               \
            const ID id = (ID)token[k]; /* token ids are below 2**31 */                        \
            const int8_t media = type[k];                                                      \
            for (Py_ssize_t i = block; i < stop; i++)                                          \
                types[i] = ids[i] == id ? media : types[i];                                    \
        }                                                                                      \
    }                                                                                          \
}

TYPE_ROWS(type_rows_64, int64_t)
TYPE_ROWS(type_rows_32, int32_t)

typedef struct {
    RowRange rows;
    const char *ids;
    int8_t *types;
    Py_ssize_t length, itemsize, count;
    int64_t token[MAX_MEDIA_TOKENS];
    int8_t type[MAX_MEDIA_TOKENS];
} TypeWork;

static void *
type_rows(void *argument)
{
    const TypeWork *work = argument;
    const Py_ssize_t first = work->rows.first_row * work->length, end = work->rows.end_row * work->length;
    if (work->itemsize == 8)
        type_rows_64((const int64_t *)work->ids, work->types, first, end, work->token, work->type, work->count);
    else
        type_rows_32((const int32_t *)work->ids, work->types, first, end, work->token, work->type, work->count);
    return NULL;
}

const char token_types_doc[] =
"token_types(ids, itemsize, batch, length, tokens, types, out, threads)\n\n"
"Write into `out` (int8 (B, L)) the media type of each token of `ids` (int64 or int32, by\n"
"`itemsize`): types[k] where the id is tokens[k], 0 elsewhere.";

PyObject *
token_types(PyObject *module, PyObject *args)
{
    PyObject *ids_obj, *tokens_obj, *types_obj, *out_obj;
    Py_ssize_t itemsize, batch, length;
    int threads;
    if (!PyArg_ParseTuple(args, "OnnnOOOi:token_types", &ids_obj, &itemsize, &batch, &length, &tokens_obj, &types_obj,
                          &out_obj, &threads))
        return NULL;
    TypeWork work[MAX_THREADS];
    TypeWork *first = &work[0];
    first->count = PySequence_Size(tokens_obj);
    if (first->count < 0)
        return NULL;
    if (first->count > MAX_MEDIA_TOKENS || PySequence_Size(types_obj) != first->count || (itemsize != 8 && itemsize != 4)) {
        PyErr_Format(PyExc_ValueError, "token_types: up to %d tokens, as many types, ids of 4 or 8 bytes",
                     MAX_MEDIA_TOKENS);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < first->count; k++) {
        PyObject *token = PySequence_GetItem(tokens_obj, k), *type = PySequence_GetItem(types_obj, k);
        first->token[k] = token ? PyLong_AsLongLong(token) : -1;
        first->type[k] = (int8_t)(type ? PyLong_AsLong(type) : -1);
        Py_XDECREF(token);
        Py_XDECREF(type);
        if (PyErr_Occurred())
            return NULL;
    }
    Py_buffer ids, out;
    if (acquire_reading("token_types", ids_obj, itemsize, out_obj, batch, length, &ids, &out) < 0)
        return NULL;
    RowRange ranges[MAX_THREADS];
    const Py_ssize_t workers = split_rows(ranges, batch, length, threads);
    first->ids = ids.buf;
    first->types = out.buf;
    first->length = length;
    first->itemsize = itemsize;
    for (Py_ssize_t w = 0; w < workers; w++) {
        if (w)
            work[w] = *first;
        work[w].rows = ranges[w];
    }
    Py_BEGIN_ALLOW_THREADS
    run_workers(type_rows, work, sizeof(TypeWork), workers);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    PyBuffer_Release(&ids);
    Py_RETURN_NONE;
}

/* How many of `count` ids are `token`. */
VECTOR_CLONES int64_t
count_token(const int64_t *restrict ids, int64_t count, int64_t token)
{
    int64_t found = 0;
    for (int64_t i = 0; i < count; i++)
        found += ids[i] == token;
    return found;
}
