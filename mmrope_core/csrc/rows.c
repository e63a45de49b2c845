/* Writing positions from runs, row by row: each sample's tokens in order, text counting on from
 * where the previous run left off, a media run on its (t, h, w) grid from its start, the text
 * after it `max(h, w)` past that start (merged grid lines), or with `past_frames` past its last
 * frame's temporal id too. No counters, no steps. */
#include "native.h"

enum { TEXT_ROW, T_ROW, H_ROW, W_ROW };

/* Where the text after run r goes on: `max(h, w)` past the run's first position; with
 * `past_frames`, at least one past its last frame's temporal id. */
static int64_t
after_run(const RunLayout *layout, Py_ssize_t r)
{
    const int64_t height = layout->height[r], width = layout->width[r];
    int64_t extent = height > width ? height : width;
    if (layout->past_frames) {
        const int64_t last = layout->temporal[layout->frame_start[r] + layout->frames[r] - 1] + 1;
        extent = last > extent ? last : extent;
    }
    return layout->position[r] + extent;
}

/* One media run's tokens, frame by frame, line by line. */
static void
write_run(int64_t *out, const RunLayout *layout, Py_ssize_t r, int kind)
{
    const int64_t position = layout->position[r], height = layout->height[r], width = layout->width[r];
    const int64_t *temporal = layout->temporal + layout->frame_start[r];
    for (int64_t frame = 0; frame < layout->frames[r]; frame++) {
        if (kind == T_ROW) {
            fill(out, height * width, position + temporal[frame]);
            out += height * width;
            continue;
        }
        for (int64_t line = 0; line < height; line++, out += width) {
            if (kind == H_ROW)
                fill(out, width, position + line);
            else
                ramp(out, width, position);
        }
    }
}

/* Row `kind` of batch row `b`: padding (1 in the text row, 0 in the others) around its samples. */
static void
write_batch_row(int64_t *out, const RunLayout *layout, Py_ssize_t b, Py_ssize_t length, int kind)
{
    const int64_t row_start = (int64_t)b * length, padding = kind == TEXT_ROW;
    Py_ssize_t s = 0, high = layout->samples;
    while (s < high) {  /* the first sample of this row */
        const Py_ssize_t middle = s + (high - s) / 2;
        if (layout->first[middle] < row_start)
            s = middle + 1;
        else
            high = middle;
    }
    int64_t column = 0;
    for (; s < layout->samples && layout->first[s] < row_start + length; s++) {
        const int64_t begin = layout->first[s] - row_start, end = begin + layout->count[s];
        fill(out + column, begin - column, padding);
        if (kind == TEXT_ROW) {
            ramp(out + begin, end - begin, 0);
        } else {
            int64_t at = begin, position = 0;
            for (Py_ssize_t r = layout->first_run[s]; r < layout->first_run[s + 1]; r++) {
                const int64_t run_begin = layout->start[r] - row_start;
                ramp(out + at, run_begin - at, layout->position[r] - (run_begin - at));
                write_run(out + run_begin, layout, r, kind);
                at = run_begin + layout->length[r];
                position = after_run(layout, r);
            }
            ramp(out + at, end - at, position);
        }
        column = end;
    }
    fill(out + column, length - column, padding);
}

typedef struct {
    int64_t *out;
    const RunLayout *layout;
    Py_ssize_t batch, length;
    int text_row;
    Py_ssize_t first_chunk, chunk_stride;
} PositionWork;

static void *
position_chunks(void *argument)
{
    const PositionWork *work = argument;
    const Py_ssize_t rows = work->text_row ? 4 : 3, chunks = rows * work->batch, length = work->length;
    for (Py_ssize_t chunk = work->first_chunk; chunk < chunks; chunk += work->chunk_stride) {
        const Py_ssize_t r = chunk / work->batch, b = chunk % work->batch;
        int64_t *row = work->out + (work->text_row ? (b * rows + r) * length : chunk * length);
        write_batch_row(row, work->layout, b, length, work->text_row ? (int)r : (int)r + T_ROW);
    }
    return NULL;
}

/* Write every row of `out` ((3, B, L), or (B, 4, L) with `text_row`), shared among threads. */
void
write_rows(int64_t *out, const RunLayout *layout, Py_ssize_t batch, Py_ssize_t length, int text_row, int threads)
{
    const Py_ssize_t rows = text_row ? 4 : 3;
    const Py_ssize_t workers = worker_count(rows * batch * length, rows * batch, threads);
    PositionWork work[MAX_THREADS];
    for (Py_ssize_t w = 0; w < workers; w++)
        work[w] = (PositionWork){out, layout, batch, length, text_row, w, workers};
    Py_BEGIN_ALLOW_THREADS
    run_workers(position_chunks, work, sizeof(PositionWork), workers);
    Py_END_ALLOW_THREADS
}

/* Each run's first position and each sample's delta (its largest position + 1 - its tokens),
 * after checking the layout hangs together; -1 with an exception set where it does not. */
int
lay_out(RunLayout *layout, Py_ssize_t runs, const int64_t *run_sample, Py_ssize_t frames_given, Py_ssize_t batch,
        Py_ssize_t length, int64_t *deltas)
{
    const Py_ssize_t tokens = batch * length;
    int64_t *position = layout->position, *frame_start = layout->frame_start;
    Py_ssize_t *first_run = layout->first_run;
    Py_ssize_t r = 0;
    int64_t frames_seen = 0, previous_end = 0;
    for (Py_ssize_t s = 0; s < layout->samples; s++) {
        const int64_t first = layout->first[s], end = first + layout->count[s];
        if (layout->count[s] < 0 || first < previous_end || end > tokens ||
            (end > first && first / length != (end - 1) / length)) {
            PyErr_Format(PyExc_ValueError, "positions: sample %zd (%lld, %lld tokens) overlaps another, or leaves "
                         "its row", s, (long long)first, (long long)layout->count[s]);
            return -1;
        }
        previous_end = end;
        first_run[s] = r;
        int64_t at = first, position_now = 0, largest = -1;
        for (; r < runs && run_sample[r] == s; r++) {
            const int64_t start = layout->start[r], frames = layout->frames[r];
            int64_t area, length;
            if (start < at || layout->length[r] > end - start || frames < 1 || layout->height[r] < 1 ||
                layout->width[r] < 1 || __builtin_mul_overflow(layout->height[r], layout->width[r], &area) ||
                __builtin_mul_overflow(frames, area, &length) || length != layout->length[r] ||
                frames > frames_given - frames_seen) {
                PyErr_Format(PyExc_ValueError, "positions: run %zd does not fit its sample %zd", r, s);
                return -1;
            }
            position[r] = position_now + (start - at);
            frame_start[r] = frames_seen;
            const int64_t last_temporal = position[r] + layout->temporal[frames_seen + frames - 1];
            largest = last_temporal > largest ? last_temporal : largest;
            frames_seen += frames;
            position_now = after_run(layout, r);
            at = start + layout->length[r];
        }
        position_now += end - at;
        if (deltas)
            deltas[s] = (position_now - 1 > largest ? position_now - 1 : largest) + 1 - layout->count[s];
    }
    first_run[layout->samples] = r;
    if (r != runs) {
        PyErr_Format(PyExc_ValueError, "positions: run %zd belongs to no sample in order", r);
        return -1;
    }
    return 0;
}

const char positions_doc[] =
"positions(out, batch, length, text_row, first, count, start, length_, sample, height, width, frames,\n"
"          temporal, deltas, threads)\n\n"
"Write positions into `out` (int64; (3, B, L), or (B, 4, L) with `text_row`, whose row 0\n"
"counts each sample's tokens from 0). Samples (int64 (S,)): `first` flat token, `count`\n"
"tokens, in order, one row each at most; outside them is padding (0, and 1 in the text row).\n"
"Media runs (int64 (R,), in reading order): flat `start`, `length_`, `sample`, merged grid\n"
"`height` x `width`, `frames`; `temporal` (int64) holds every run's frames' temporal ids in\n"
"turn. `deltas` (int64 (S,), or None) receives each sample's largest position + 1 - count.";

PyObject *
positions(PyObject *module, PyObject *args)
{
    PyObject *out_obj, *deltas_obj, *objects[9];
    Py_ssize_t batch, length;
    int text_row, threads, past_frames = 0;
    if (!PyArg_ParseTuple(args, "OnnpOOOOOOOOOOi|p:positions", &out_obj, &batch, &length, &text_row, &objects[0],
                          &objects[1], &objects[2], &objects[3], &objects[4], &objects[5], &objects[6], &objects[7],
                          &objects[8], &deltas_obj, &threads, &past_frames))
        return NULL;
    static const char *names[9] = {"first", "count", "start", "length", "sample", "height", "width", "frames", "temporal"};
    Py_buffer views[9], out, deltas = {0};
    int held = 0;
    PyObject *result = NULL;
    Py_ssize_t *first_run = NULL;
    int64_t *scratch = NULL;
    for (; held < 9; held++)
        if (acquire(objects[held], &views[held], 0, 8, names[held]) < 0)
            goto release;
    if (acquire(out_obj, &out, 1, 8, "out") < 0)
        goto release;
    if (deltas_obj != Py_None && acquire(deltas_obj, &deltas, 1, 8, "deltas") < 0) {
        PyBuffer_Release(&out);
        goto release;
    }
    const Py_ssize_t samples = views[0].len / 8, runs = views[2].len / 8, rows = text_row ? 4 : 3;
    int sizes_fit = batch >= 0 && length >= 0 && out.len / 8 == rows * batch * length && views[1].len / 8 == samples &&
                    (deltas_obj == Py_None || deltas.len / 8 == samples);
    for (int k = 3; k < 8; k++)
        sizes_fit &= views[k].len / 8 == runs;
    if (!sizes_fit) {
        PyErr_Format(PyExc_ValueError, "positions: sizes do not fit a batch of %zd x %zd", batch, length);
        goto release_outputs;
    }
    first_run = PyMem_Malloc((size_t)(samples + 1) * sizeof(Py_ssize_t));
    scratch = PyMem_Malloc((size_t)(2 * runs + 1) * sizeof(int64_t));
    if (!first_run || !scratch) {
        PyErr_NoMemory();
        goto release_outputs;
    }
    RunLayout layout = {views[0].buf, views[1].buf, samples, views[2].buf, views[3].buf, views[5].buf,
                        views[6].buf, views[7].buf, views[8].buf, scratch, scratch + runs, first_run, past_frames};
    if (lay_out(&layout, runs, views[4].buf, views[8].len / 8, batch, length,
                deltas_obj == Py_None ? NULL : deltas.buf) < 0)
        goto release_outputs;
    write_rows(out.buf, &layout, batch, length, text_row, threads);
    result = Py_NewRef(Py_None);
release_outputs:
    if (deltas_obj != Py_None)
        PyBuffer_Release(&deltas);
    PyBuffer_Release(&out);
release:
    PyMem_Free(first_run);
    PyMem_Free(scratch);
    while (held > 0)
        PyBuffer_Release(&views[--held]);
    return result;
}
