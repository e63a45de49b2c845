/* Reading token ids: each id's media type, how often a token occurs, where one occurs, and
 * which placeholders lie between begin and end markers. */
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

#define ANY_EQUAL(NAME, ID)                                                                    \
VECTOR_CLONES static int                                                                       \
NAME(const ID *restrict ids, Py_ssize_t count, int64_t value)                                  \
{                                                                                              \
    const ID wanted = (ID)value;                                                               \
    int found = 0;                                                                             \
    for (Py_ssize_t i = 0; i < count; i++)                                                     \
        found |= ids[i] == wanted;                                                             \
    return found;                                                                              \
}

/* A placeholder (any token typed 1 so far) switches to type 2 where more begin than end markers
 * precede it, itself included, counting from `begin` (the row's or the segment's start). */
#define BETWEEN_MARKERS(NAME, ID)                                                                 \
static void                                                                                    \
NAME(const ID *ids, int8_t *types, Py_ssize_t begin, Py_ssize_t end, int64_t opens, int64_t closes) \
{                                                                                              \
    int64_t open = 0;                                                                          \
    for (Py_ssize_t i = begin; i < end; i++) {                                                 \
        open += (ids[i] == (ID)opens) - (ids[i] == (ID)closes);                                \
        if (open > 0 && types[i])                                                              \
            types[i] = 2;                                                                      \
    }                                                                                          \
}

ANY_EQUAL(any_equal_64, int64_t)
ANY_EQUAL(any_equal_32, int32_t)
BETWEEN_MARKERS(between_markers_64, int64_t)
BETWEEN_MARKERS(between_markers_32, int32_t)

/* Whether any of `count` ids (of `itemsize` bytes: 8 or 4) is `value`. */
int
any_equal(const char *ids, Py_ssize_t itemsize, Py_ssize_t count, int64_t value)
{
    return itemsize == 8 ? any_equal_64((const int64_t *)ids, count, value)
                         : any_equal_32((const int32_t *)ids, count, value);
}

void
between_markers(const char *ids, Py_ssize_t itemsize, int8_t *types, Py_ssize_t begin, Py_ssize_t end, int64_t opens,
                int64_t closes)
{
    if (itemsize == 8)
        between_markers_64((const int64_t *)ids, types, begin, end, opens, closes);
    else
        between_markers_32((const int32_t *)ids, types, begin, end, opens, closes);
}
