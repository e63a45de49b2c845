/* Writing blocks of positions: fills and ramps of int64 or float32 values (or float32 values
 * truncated to int64), on one row or the three (t, h, w) rows alike, and grids of merged patches
 * frame by frame. */
#include "native.h"

#include <string.h>

VECTOR_CLONES void
fill(int64_t *restrict out, Py_ssize_t count, int64_t value)
{
    for (Py_ssize_t i = 0; i < count; i++)
        out[i] = value;
}

VECTOR_CLONES void
ramp(int64_t *restrict out, Py_ssize_t count, int64_t value)
{
    for (Py_ssize_t i = 0; i < count; i++)
        out[i] = value + i;
}

VECTOR_CLONES void
fill_f32(float *restrict out, Py_ssize_t count, float value)
{
    for (Py_ssize_t i = 0; i < count; i++)
        out[i] = value;
}

/* (float)(first + i) + start: an int64 arange plus a float32 scalar, as torch adds them
 * (indices are below 2**31: int32 converts to float in vector instructions). */
VECTOR_CLONES void
ramp_f32(float *restrict out, int32_t count, int32_t first, float start)
{
    for (int32_t i = 0; i < count; i++)
        out[i] = (float)(first + i) + start;
}

/* ramp_f32's values truncated toward zero: through int32 where they all fit it (which vector
 * instructions convert eight at a time), else one by one. */
VECTOR_CLONES void
ramp_truncated(int64_t *restrict out, int32_t count, int32_t first, float start)
{
    if (start >= 0 && (double)first + count + start < 1073741824.0) {
        for (int32_t i = 0; i < count; i++)
            out[i] = (int32_t)((float)(first + i) + start);
        return;
    }
    for (int32_t i = 0; i < count; i++)
        out[i] = (int64_t)((float)(first + i) + start);
}

/* Frame `frame` of a grid, whole, at token `at`: every frame's height and width rows are those
 * of the first frame written. */
void
grid_frame(int form, char *const row[3], int64_t at, GridBlock *g, int64_t frame)
{
    const int64_t per_frame = g->height * g->width;
    const size_t size = form_size(form);
    values_fill(form, row[0], at, per_frame, values_add(form, grid_temporal(g, frame), g->start));
    if (g->pattern >= 0) {
        for (int r = 1; r < 3; r++)
            memcpy(row[r] + at * size, row[r] + g->pattern * size, (size_t)per_frame * size);
        return;
    }
    for (int64_t line = 0; line < g->height; line++) {
        values_fill(form, row[1], at + line * g->width, g->width, values_add(form, (double)line, g->start));
        values_ramp(form, row[2], at + line * g->width, g->width, 0, g->start);
    }
    g->pattern = at;
}

/* Tokens [from, to) of a grid, in its order, at token `at`. */
void
grid_range(int form, char *const row[3], int64_t at, GridBlock *g, int64_t from, int64_t to)
{
    const int64_t per_frame = g->height * g->width;
    while (from < to) {
        const int64_t frame = from / per_frame, in_frame = from - frame * per_frame;
        if (in_frame == 0 && to - from >= per_frame) {
            grid_frame(form, row, at, g, frame);
            at += per_frame;
            from += per_frame;
            continue;
        }
        const int64_t line = in_frame / g->width, column = in_frame - line * g->width;
        const int64_t count = g->width - column < to - from ? g->width - column : to - from;
        values_fill(form, row[0], at, count, values_add(form, grid_temporal(g, frame), g->start));
        values_fill(form, row[1], at, count, values_add(form, (double)line, g->start));
        values_ramp(form, row[2], at, count, column, g->start);
        at += count;
        from += count;
    }
}
