/* Reading attention masks: 0 and 1 only, as bool; each row's span of valid tokens; token types
 * coded with -1 at padding; where values change. */
#include "native.h"

#include <string.h>

typedef struct {
    RowRange rows;
    const char *mask;
    uint8_t *valid;
    Py_ssize_t length, itemsize;
    Py_ssize_t first_bad;  /* flat index of the first value other than 0 and 1, or -1 */
    Py_ssize_t first_empty_row;  /* or -1 */
    int all_ones;
} MaskWork;

/* One row of a mask: writes where it is 1, returns how many ones; `others` gathers the bits of
 * any other value. */
#define MASK_ROW(NAME, TYPE)                                                                     \
VECTOR_CLONES static uint64_t                                                                    \
NAME(const TYPE *restrict mask, uint8_t *restrict valid, Py_ssize_t length, uint64_t *others)    \
{                                                                                                \
    uint64_t ones = 0;                                                                           \
    TYPE other = 0;                                                                              \
    for (Py_ssize_t i = 0; i < length; i++) {                                                    \
        const TYPE value = mask[i];                                                              \
        ones += value == 1;                                                                      \
        other |= value & (TYPE)~(TYPE)1;                                                         \
        valid[i] = value == 1;                                                                   \
    }                                                                                            \
    *others |= other;                                                                            \
    return ones;                                                                                 \
}

MASK_ROW(mask_row_8, uint8_t)
MASK_ROW(mask_row_16, uint16_t)
MASK_ROW(mask_row_32, uint32_t)
MASK_ROW(mask_row_64, uint64_t)

static uint64_t
mask_value(const char *mask, Py_ssize_t itemsize, Py_ssize_t i)
{
    switch (itemsize) {
    case 1: return ((const uint8_t *)mask)[i];
    case 2: return ((const uint16_t *)mask)[i];
    case 4: return ((const uint32_t *)mask)[i];
    default: return ((const uint64_t *)mask)[i];
    }
}

static void *
mask_rows(void *argument)
{
    MaskWork *work = argument;
    const Py_ssize_t length = work->length, itemsize = work->itemsize;
    Py_ssize_t first_bad = -1, first_empty_row = -1;
    int all_ones = 1;
    for (Py_ssize_t b = work->rows.first_row; b < work->rows.end_row; b++) {
        const char *row = work->mask + b * length * itemsize;
        uint8_t *valid = work->valid + b * length;
        uint64_t others = 0, ones;
        switch (itemsize) {
        case 1: ones = mask_row_8((const uint8_t *)row, valid, length, &others); break;
        case 2: ones = mask_row_16((const uint16_t *)row, valid, length, &others); break;
        case 4: ones = mask_row_32((const uint32_t *)row, valid, length, &others); break;
        default: ones = mask_row_64((const uint64_t *)row, valid, length, &others);
        }
        if (others && first_bad < 0) {
            Py_ssize_t i = 0;
            while (mask_value(row, itemsize, i) <= 1)
                i++;
            first_bad = b * length + i;
        }
        if (ones == 0 && first_empty_row < 0)
            first_empty_row = b;
        all_ones &= ones == (uint64_t)length;
    }
    work->first_bad = first_bad;
    work->first_empty_row = first_empty_row;
    work->all_ones = all_ones;
    return NULL;
}

const char read_mask_doc[] =
"read_mask(mask, itemsize, batch, length, valid, threads) -> (all_ones, first_bad, first_empty_row)\n\n"
"Write into `valid` (bool (B, L)) where `mask` (integers of `itemsize` bytes) is 1. Returns\n"
"whether every value is 1, the flat index of the first value other than 0 and 1 (-1 if none)\n"
"and the first row without a 1 (-1 if none).";

PyObject *
read_mask(PyObject *module, PyObject *args)
{
    PyObject *mask_obj, *valid_obj;
    Py_ssize_t itemsize, batch, length;
    int threads;
    if (!PyArg_ParseTuple(args, "OnnnOi:read_mask", &mask_obj, &itemsize, &batch, &length, &valid_obj, &threads))
        return NULL;
    if (itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8) {
        PyErr_Format(PyExc_ValueError, "read_mask: items of 1, 2, 4 or 8 bytes, not %zd", itemsize);
        return NULL;
    }
    Py_buffer mask, valid;
    if (acquire_reading("read_mask", mask_obj, itemsize, valid_obj, batch, length, &mask, &valid) < 0)
        return NULL;
    RowRange ranges[MAX_THREADS];
    MaskWork work[MAX_THREADS];
    const Py_ssize_t workers = split_rows(ranges, batch, length, threads);
    for (Py_ssize_t w = 0; w < workers; w++)
        work[w] = (MaskWork){ranges[w], mask.buf, valid.buf, length, itemsize, -1, -1, 1};
    Py_BEGIN_ALLOW_THREADS
    run_workers(mask_rows, work, sizeof(MaskWork), workers);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&valid);
    PyBuffer_Release(&mask);
    Py_ssize_t first_bad = -1, first_empty_row = -1;
    int all_ones = 1;
    for (Py_ssize_t w = 0; w < workers; w++) {  /* in row order: the first found is the first */
        if (first_bad < 0)
            first_bad = work[w].first_bad;
        if (first_empty_row < 0)
            first_empty_row = work[w].first_empty_row;
        all_ones &= work[w].all_ones;
    }
    return Py_BuildValue("Nnn", PyBool_FromLong(all_ones), first_bad, first_empty_row);
}

/* Each row's valid tokens from a bool mask: one span per row, or -1 where padding lies inside
 * one. A row of padding has no token, at its start. */
int
mask_spans(const uint8_t *mask, Py_ssize_t batch, Py_ssize_t length, int64_t *first, int64_t *count)
{
    for (Py_ssize_t b = 0; b < batch; b++) {
        const uint8_t *m = mask + b * length;
        Py_ssize_t low = 0, high = length;
        while (low + 8 <= length) {  /* eight bytes at a time through the padding */
            uint64_t word;
            memcpy(&word, m + low, 8);
            if (word)
                break;
            low += 8;
        }
        while (low < length && !m[low])
            low++;
        while (high - 8 >= low) {
            uint64_t word;
            memcpy(&word, m + high - 8, 8);
            if (word)
                break;
            high -= 8;
        }
        while (high > low && !m[high - 1])
            high--;
        uint8_t all = 1;
        for (Py_ssize_t i = low; i < high; i++)
            all &= m[i];
        if (!all)
            return -1;
        first[b] = b * length + (high > low ? low : 0);
        count[b] = high - low;
    }
    return 0;
}

VECTOR_CLONES static void
code_tokens(const int8_t *restrict types, const uint8_t *restrict valid, int8_t *restrict code, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++)  /* valid is 0 or 1: no branch, so the loop vectorizes */
        code[i] = (int8_t)(types[i] * valid[i] + valid[i] - 1);
}

const char coded_doc[] =
"coded(types, valid, code)\n\n"
"Write into `code` (int8) the token types `types` (int8) where `valid` (bool) holds, -1 elsewhere.";

PyObject *
coded(PyObject *module, PyObject *args)
{
    PyObject *types_obj, *valid_obj, *code_obj;
    if (!PyArg_ParseTuple(args, "OOO:coded", &types_obj, &valid_obj, &code_obj))
        return NULL;
    Py_buffer types, valid, code;
    if (acquire(types_obj, &types, 0, 1, "types") < 0)
        return NULL;
    if (acquire(valid_obj, &valid, 0, 1, "valid") < 0)
        goto release_types;
    if (acquire(code_obj, &code, 1, 1, "code") < 0)
        goto release_valid;
    if (valid.len != types.len || code.len != types.len) {
        PyErr_Format(PyExc_ValueError, "coded: %zd types, %zd valid, %zd code", types.len, valid.len, code.len);
    } else {
        Py_BEGIN_ALLOW_THREADS
        code_tokens(types.buf, valid.buf, code.buf, types.len);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&code);
release_valid:
    PyBuffer_Release(&valid);
release_types:
    PyBuffer_Release(&types);
    return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
}

/* The places where a byte differs from the next, eight bytes at a time: most words equal the
 * word one byte on, and cost one comparison. */
static int
append_changes(const uint8_t *bytes, Py_ssize_t count, int64_t **found, Py_ssize_t *size, Py_ssize_t *capacity)
{
    for (Py_ssize_t i = 0; i + 1 < count;) {
        if (i + 9 <= count) {
            uint64_t here, next;
            memcpy(&here, bytes + i, 8);
            memcpy(&next, bytes + i + 1, 8);
            if (here == next) {
                i += 8;
                continue;
            }
        }
        const Py_ssize_t stop = i + 8 < count - 1 ? i + 8 : count - 1;
        for (; i < stop; i++) {
            if (bytes[i] == bytes[i + 1])
                continue;
            if (*size == *capacity) {
                const Py_ssize_t grown = *capacity ? 2 * *capacity : 256;
                int64_t *moved = PyMem_RawRealloc(*found, (size_t)grown * sizeof(int64_t));
                if (!moved)
                    return -1;
                *found = moved;
                *capacity = grown;
            }
            (*found)[(*size)++] = i;
        }
    }
    return 0;
}

const char changes_doc[] =
"changes(values) -> bytes\n\n"
"The indices p (int64, as bytes) where the byte values[p] differs from values[p + 1].";

PyObject *
changes(PyObject *module, PyObject *values_obj)
{
    Py_buffer values;
    if (acquire(values_obj, &values, 0, 1, "values") < 0)
        return NULL;
    int64_t *found = NULL;
    Py_ssize_t size = 0, capacity = 0;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = append_changes(values.buf, values.len, &found, &size, &capacity);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&values);
    PyObject *result = failed ? PyErr_NoMemory() : PyBytes_FromStringAndSize((const char *)found, size * (Py_ssize_t)sizeof(int64_t));
    PyMem_RawFree(found);
    return result;
}
