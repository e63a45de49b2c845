/* Finding runs of placeholder tokens: maximal stretches of one positive media type in a row of
 * token types, with the sample each belongs to. */
#include "native.h"

#include <string.h>

int
runs_append(Runs *runs, int64_t start, int64_t length, int8_t type, int64_t sample)
{
    if (runs->size == runs->capacity) {  /* one block: starts, lengths, samples, then types */
        const Py_ssize_t grown = runs->capacity ? 2 * runs->capacity : 64;
        int64_t *block = PyMem_RawMalloc((size_t)grown * (3 * sizeof(int64_t) + 1));
        if (!block)
            return -1;
        int8_t *types = (int8_t *)(block + 3 * grown);
        if (runs->size) {
            memcpy(block, runs->start, (size_t)runs->size * sizeof(int64_t));
            memcpy(block + grown, runs->length, (size_t)runs->size * sizeof(int64_t));
            memcpy(block + 2 * grown, runs->sample, (size_t)runs->size * sizeof(int64_t));
            memcpy(types, runs->type, (size_t)runs->size);
        }
        PyMem_RawFree(runs->start);
        runs->start = block, runs->length = block + grown, runs->sample = block + 2 * grown, runs->type = types;
        runs->capacity = grown;
    }
    runs->start[runs->size] = start;
    runs->length[runs->size] = length;
    runs->sample[runs->size] = sample;
    runs->type[runs->size++] = type;
    return 0;
}

/* The runs of equal positive type in types[begin, end) of a row starting at flat `row_start`:
 * text is skipped and runs extended eight bytes at a time. */
int
runs_scan(const int8_t *types, Py_ssize_t begin, Py_ssize_t end, int64_t row_start, int64_t sample, Runs *runs)
{
    Py_ssize_t i = begin;
    while (i < end) {
        uint64_t word;
        while (i + 8 <= end && (memcpy(&word, types + i, 8), word == 0))
            i += 8;
        while (i < end && types[i] == 0)
            i++;
        if (i >= end)
            break;
        const int8_t type = types[i];
        const uint64_t same = (uint64_t)(uint8_t)type * 0x0101010101010101ULL;
        Py_ssize_t j = i + 1;
        while (j + 8 <= end && (memcpy(&word, types + j, 8), word == same))
            j += 8;
        while (j < end && types[j] == type)
            j++;
        if (runs_append(runs, row_start + i, j - i, type, sample) < 0)
            return -1;
        i = j;
    }
    return 0;
}

/* `count` workers' runs, in order, into `joined`; the parts are left empty. */
int
runs_join(Runs *joined, Runs *parts, Py_ssize_t count)
{
    if (count == 1) {
        *joined = parts[0];
        parts[0] = (Runs){0};
        return 0;
    }
    for (Py_ssize_t w = 0; w < count; w++)
        for (Py_ssize_t r = 0; r < parts[w].size; r++)
            if (runs_append(joined, parts[w].start[r], parts[w].length[r], parts[w].type[r], parts[w].sample[r]) < 0)
                return -1;
    return 0;
}
