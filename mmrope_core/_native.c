/* mmrope_core._native: the loops over every token of a CPU batch, compiled.
 *
 * What the engine and the M-RoPE kernel do per token, each token read or written once here:
 * - read_mask: check an attention mask holds only 0 and 1, as bool;
 * - token_types: each token id's media type;
 * - coded: token types with -1 at padding, and changes: where that code changes;
 * - positions: the rows of positions, written from the media runs the changes give;
 * - mrope_fused: all of these for a Qwen-style kernel's common case, in one call.
 * torch does each of these in several passes over the batch in memory; what is per run or per
 * frame (the runs, their grids, temporal ids) is worked out in numpy. The buffers are acquired
 * and checked with the GIL held; the loops run without it, on threads started and joined within
 * the call for large batches, so calls from several threads may overlap and a fork finds no
 * pool.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define MAX_THREADS 64

/* The loops over tokens compare 64-bit ids and mask values and write 64-bit positions, which
 * x86-64's baseline vector instructions do two at a time at best: where the loader can pick a
 * function at run time (GNU ifunc), those loops are also built for AVX2 and used on CPUs that
 * have it. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* Run `task` on each of `workers` work items (`size` bytes apart): the first on this thread,
 * the others on threads started for this call and joined before it returns, so nothing lingers
 * (data-loader workers fork). A thread that cannot be started leaves its item to this thread. */
static void
run_workers(void *(*task)(void *), void *items, size_t size, Py_ssize_t workers)
{
    pthread_t started[MAX_THREADS];
    int running[MAX_THREADS] = {0};
    for (Py_ssize_t w = 1; w < workers; w++)
        running[w] = pthread_create(&started[w], NULL, task, (char *)items + w * size) == 0;
    task(items);
    for (Py_ssize_t w = 1; w < workers; w++) {
        if (running[w])
            pthread_join(started[w], NULL);
        else
            task((char *)items + w * size);
    }
}

static int
acquire(PyObject *object, Py_buffer *view, int writable, Py_ssize_t itemsize, const char *name)
{
    if (PyObject_GetBuffer(object, view, writable ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->len % itemsize != 0) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is not a whole number of %zd-byte items", name, view->len, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Below this many positions written (or tokens read) per thread, another thread costs more
 * than it saves: starting and joining one takes some 20 microseconds, the work itself well
 * under a nanosecond per item. */
#define ITEMS_PER_THREAD (1 << 17)

/* How many workers share `items` cut into `parts` (rows of a batch, rows of the output). */
static Py_ssize_t
worker_count(Py_ssize_t items, Py_ssize_t parts, int threads)
{
    Py_ssize_t workers = items / ITEMS_PER_THREAD;
    if (workers > threads)
        workers = threads;
    if (workers > parts)
        workers = parts;
    if (workers > MAX_THREADS)
        workers = MAX_THREADS;
    return workers < 1 ? 1 : workers;
}

/* What the readings below take: a (B, L) input of `itemsize`-byte items and the (B, L) bytes
 * they write, both acquired and checked; on failure neither is held. */
static int
acquire_reading(const char *name, PyObject *input_obj, Py_ssize_t itemsize, PyObject *output_obj,
                Py_ssize_t batch, Py_ssize_t length, Py_buffer *input, Py_buffer *output)
{
    if (acquire(input_obj, input, 0, itemsize, name) < 0)
        return -1;
    if (acquire(output_obj, output, 1, 1, name) < 0) {
        PyBuffer_Release(input);
        return -1;
    }
    if (batch < 0 || length < 0 || input->len != batch * length * itemsize || output->len != batch * length) {
        PyErr_Format(PyExc_ValueError, "%s: sizes do not fit a batch of %zd x %zd: input %zd bytes, output %zd",
                     name, batch, length, input->len, output->len);
        PyBuffer_Release(output);
        PyBuffer_Release(input);
        return -1;
    }
    return 0;
}

/* Positions written from the runs themselves: each sample's tokens in order, text counting on
 * from where the previous run left off, a media run on its (t, h, w) grid from its start, the
 * text after it `max(h, w)` past that start (merged grid lines), or with `past_frames` (vLLM's
 * rule) past its last frame's temporal id too. No counters, no steps. */
typedef struct {
    const int64_t *first, *count;  /* samples: flat index of the first token, number of tokens */
    Py_ssize_t samples;
    const int64_t *start, *length, *height, *width, *frames;  /* runs, in reading order */
    const int64_t *temporal;  /* each frame's temporal id, run after run */
    /* worked out by lay_out: */
    int64_t *position;  /* each run's first position */
    int64_t *frame_start;  /* where each run's temporal ids begin in `temporal` */
    Py_ssize_t *first_run;  /* the runs of sample s: first_run[s] to first_run[s + 1] */
    int past_frames;  /* text after a run resumes past its largest position on any axis */
} Layout;

enum { TEXT_ROW, T_ROW, H_ROW, W_ROW };

/* Where the text after run r goes on: `max(h, w)` past the run's first position; with
 * `past_frames`, at least one past its last frame's temporal id. */
static int64_t
after_run(const Layout *layout, Py_ssize_t r)
{
    const int64_t height = layout->height[r], width = layout->width[r];
    int64_t extent = height > width ? height : width;
    if (layout->past_frames) {
        const int64_t last = layout->temporal[layout->frame_start[r] + layout->frames[r] - 1] + 1;
        extent = last > extent ? last : extent;
    }
    return layout->position[r] + extent;
}

VECTOR_CLONES static void
fill(int64_t *restrict out, Py_ssize_t count, int64_t value)
{
    for (Py_ssize_t i = 0; i < count; i++)
        out[i] = value;
}

VECTOR_CLONES static void
ramp(int64_t *restrict out, Py_ssize_t count, int64_t value)
{
    for (Py_ssize_t i = 0; i < count; i++)
        out[i] = value + i;
}

/* One media run's tokens, frame by frame, line by line. */
static void
write_run(int64_t *out, const Layout *layout, Py_ssize_t r, int kind)
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
write_batch_row(int64_t *out, const Layout *layout, Py_ssize_t b, Py_ssize_t length, int kind)
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
    const Layout *layout;
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

/* Each run's first position and each sample's delta (its largest position + 1 - its tokens),
 * after checking the layout hangs together; -1 with an exception set where it does not. */
static int
lay_out(Layout *layout, Py_ssize_t runs, const int64_t *run_sample, Py_ssize_t frames_given, Py_ssize_t batch,
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

PyDoc_STRVAR(positions_doc,
"positions(out, batch, length, text_row, first, count, start, length_, sample, height, width, frames,\n"
"          temporal, deltas, threads)\n\n"
"Write positions into `out` (int64; (3, B, L), or (B, 4, L) with `text_row`, whose row 0\n"
"counts each sample's tokens from 0). Samples (int64 (S,)): `first` flat token, `count`\n"
"tokens, in order, one row each at most; outside them is padding (0, and 1 in the text row).\n"
"Media runs (int64 (R,), in reading order): flat `start`, `length_`, `sample`, merged grid\n"
"`height` x `width`, `frames`; `temporal` (int64) holds every run's frames' temporal ids in\n"
"turn. `deltas` (int64 (S,), or None) receives each sample's largest position + 1 - count.");

static PyObject *
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
    Layout layout = {views[0].buf, views[1].buf, samples, views[2].buf, views[3].buf, views[5].buf,
                     views[6].buf, views[7].buf, views[8].buf, scratch, scratch + runs, first_run, past_frames};
    if (lay_out(&layout, runs, views[4].buf, views[8].len / 8, batch, length,
                deltas_obj == Py_None ? NULL : deltas.buf) < 0)
        goto release_outputs;
    const Py_ssize_t workers = worker_count(rows * batch * length, rows * batch, threads);
    PositionWork work[MAX_THREADS];
    for (Py_ssize_t w = 0; w < workers; w++)
        work[w] = (PositionWork){out.buf, &layout, batch, length, text_row, w, workers};
    Py_BEGIN_ALLOW_THREADS
    run_workers(position_chunks, work, sizeof(PositionWork), workers);
    Py_END_ALLOW_THREADS
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

/* Rows [first_row, end_row) of a batch, one range per worker. */
typedef struct {
    Py_ssize_t first_row, end_row;
} RowRange;

static Py_ssize_t
split_rows(RowRange *ranges, Py_ssize_t batch, Py_ssize_t length, int threads)
{
    const Py_ssize_t workers = worker_count(batch * length, batch, threads);
    for (Py_ssize_t w = 0; w < workers; w++)
        ranges[w] = (RowRange){batch * w / workers, batch * (w + 1) / workers};
    return workers;
}

/* Reading token ids: each id's media type, 0 for text. */
#define MAX_MEDIA_TOKENS 16

typedef struct {
    RowRange rows;
    const char *ids;
    int8_t *types;
    Py_ssize_t length, itemsize, count;
    int64_t token[MAX_MEDIA_TOKENS];
    int8_t type[MAX_MEDIA_TOKENS];
} TypeWork;

/* The ids of one worker's rows in blocks that stay in the first-level cache, each block read
 * once per media token by a loop the compiler turns into vector compares. */
#define TYPE_BLOCK 512

#define TYPE_ROWS(NAME, ID)                                                                    \
VECTOR_CLONES static void                                                                      \
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

PyDoc_STRVAR(token_types_doc,
"token_types(ids, itemsize, batch, length, tokens, types, out, threads)\n\n"
"Write into `out` (int8 (B, L)) the media type of each token of `ids` (int64 or int32, by\n"
"`itemsize`): types[k] where the id is tokens[k], 0 elsewhere.");

static PyObject *
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

/* Reading an attention mask: 0 and 1 only, as bool, and which rows hold a 1. */
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

PyDoc_STRVAR(read_mask_doc,
"read_mask(mask, itemsize, batch, length, valid, threads) -> (all_ones, first_bad, first_empty_row)\n\n"
"Write into `valid` (bool (B, L)) where `mask` (integers of `itemsize` bytes) is 1. Returns\n"
"whether every value is 1, the flat index of the first value other than 0 and 1 (-1 if none)\n"
"and the first row without a 1 (-1 if none).");

static PyObject *
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

/* Reading token types: where they are masked, and where they change. */
VECTOR_CLONES static void
code_tokens(const int8_t *restrict types, const uint8_t *restrict valid, int8_t *restrict code, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++)  /* valid is 0 or 1: no branch, so the loop vectorizes */
        code[i] = (int8_t)(types[i] * valid[i] + valid[i] - 1);
}

PyDoc_STRVAR(coded_doc,
"coded(types, valid, code)\n\n"
"Write into `code` (int8) the token types `types` (int8) where `valid` (bool) holds, -1 elsewhere.");

static PyObject *
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

PyDoc_STRVAR(changes_doc,
"changes(values) -> bytes\n\n"
"The indices p (int64, as bytes) where the byte values[p] differs from values[p + 1].");

static PyObject *
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

/* The Omni thinkers' positions (Qwen3-Omni in float32, Qwen2.5-Omni in int64).
 *
 * The thinker's get_rope_index walks each sample's media items (audio, image, video, a video
 * with its audio interleaved) in order, each placed one past the largest position of what was
 * placed just before it, and text counting on between them. Here one read of each sample's
 * tokens finds and checks its items, which take the batch's grids and audio lengths in order;
 * then each position is written once. Qwen3-Omni's positions can be fractional (a video's
 * temporal ids are frame * seconds per grid * positions per second): every sum is the float32
 * sum the reference makes, in its order, so the values are bitwise its own. The scalars are
 * kept as doubles, which hold every float32 and every position of an int64 batch exactly;
 * omni_add rounds to float32 where the reference works in it.
 *
 * With `vllm` set, the positions are those vLLM 0.33 computes for each sample (int64 for both
 * generations, see omni_sample_vllm); the items are read the same way. */

enum { OMNI_IMAGE, OMNI_VIDEO, OMNI_AUDIO, OMNI_AUDIO_IN_VIDEO };

/* What omni_positions returns: written, or why not (the caller says how, or compacts the
 * batch and calls again). */
enum { OMNI_WRITTEN, OMNI_MISMATCH, OMNI_PADDING_INSIDE, OMNI_BAD_MEDIA, OMNI_EMPTY_SAMPLE };

typedef struct {
    int64_t start;  /* its first marker, among its sample's tokens */
    int64_t media;  /* its image, video or audio, in the batch's order */
    int64_t audio;  /* for a video with its audio, that audio */
    int64_t tokens;  /* from its first marker to its last */
    int kind;
} OmniItem;

typedef struct {
    const int64_t *ids;
    Py_ssize_t batch, length;
    const int64_t *first, *count;  /* samples: flat index of the first token, and tokens */
    Py_ssize_t samples;
    int one_per_row;  /* each row holds one sample with padding around it (else samples cover the rows) */
    int64_t image, video, audio, vision_start, vision_end, audio_start, audio_end;
    int64_t special_low;  /* start markers and placeholders lie in [special_low, special_low + special_span] */
    uint64_t special_span;
    int qwen3, audio_in_video, text_only;
    int vllm;  /* vLLM 0.33's positions */
    int float32;  /* positions are float32 (Qwen3-Omni's reference), else int64 */
    int64_t merge, chunk, n_window;  /* chunk: positions per chunk of a video with its audio (Qwen2.5-Omni) */
    float per_second;
    double factor;  /* vLLM: temporal positions per second, a double as Python holds it */
    const int64_t *image_grid, *video_grid, *audio_frames;
    const float *seconds;
    Py_ssize_t images, videos, audios;
    OmniItem *items;
    Py_ssize_t *first_item;  /* the items of sample s: first_item[s] to first_item[s + 1] */
    char *out;
    int text_row;
    char *deltas;
} Omni;

static int64_t
floor_div(int64_t a, int64_t b)
{
    const int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* Audio placeholder tokens for `frames` mel frames, as each generation's encoder counts them
 * (Python's floor division). */
static int64_t
omni_audio_tokens(const Omni *o, int64_t frames)
{
    if (frames > ((int64_t)1 << 56))  /* beyond any row, and whole * 13 below stays in range */
        return -1;
    if (o->qwen3) {
        const int64_t window = 2 * o->n_window, whole = floor_div(frames, window);
        const int64_t rest = floor_div(frames - whole * window - 1, 2) + 1;
        return floor_div(floor_div(rest - 1, 2) + 1 - 1, 2) + 1 + whole * 13;
    }
    return floor_div(floor_div(frames - 1, 2) + 1 - 2, 2) + 1;
}

/* -1 where the count overflows int64: no row holds that many tokens. */
static int64_t
omni_vision_tokens(const Omni *o, const int64_t *grid)
{
    int64_t area, tokens;
    if (__builtin_mul_overflow(grid[1] / o->merge, grid[2] / o->merge, &area) ||
        __builtin_mul_overflow(grid[0], area, &tokens))
        return -1;
    return tokens;
}

VECTOR_CLONES static int64_t
count_token(const int64_t *restrict ids, int64_t count, int64_t token)
{
    int64_t found = 0;
    for (int64_t i = 0; i < count; i++)
        found += ids[i] == token;
    return found;
}

/* Grids, timing and audio lengths the positions can be computed from. */
static int
omni_media_fit(const Omni *o)
{
    for (int kind = 0; kind < 2; kind++) {
        const int64_t *grid = kind ? o->video_grid : o->image_grid;
        const Py_ssize_t rows = kind ? o->videos : o->images;
        for (Py_ssize_t r = 0; r < 3 * rows; r += 3)
            if (grid[r] < 1 || grid[r + 1] < 1 || grid[r + 2] < 1 || grid[r + 1] % o->merge || grid[r + 2] % o->merge)
                return 0;
    }
    for (Py_ssize_t v = 0; v < o->videos; v++)  /* mmrope_core.media.MAX_SECONDS_PER_GRID: temporal ids fit int64 */
        if (!Py_IS_FINITE(o->seconds[v]) || !(o->seconds[v] >= 0) || o->seconds[v] > 1048576.0)
            return 0;
    for (Py_ssize_t a = 0; a < o->audios; a++)
        if (o->audio_frames[a] < 0)
            return 0;
    return o->merge >= 1 && (!o->qwen3 || o->n_window >= 1) && (o->qwen3 || o->chunk >= 1);
}

/* Each sample's items in order, checked against the grids and audio lengths they take:
 * OMNI_MISMATCH where markers, placeholders and media disagree. A start marker that opens
 * no item (sampled in a response) is text, as the model reads it. */
static int
omni_read(Omni *o, Py_ssize_t *capacity)
{
    Py_ssize_t found = 0, image = 0, video = 0, audio = 0;
    for (Py_ssize_t s = 0; s < o->samples; s++) {
        o->first_item[s] = found;
        const int64_t *ids = o->ids + o->first[s], n = o->count[s];
        int paired = 0, alone = 0;  /* videos with their audio, and audios of their own */
        if (n == 0 && !o->text_only)
            return OMNI_EMPTY_SAMPLE;
        for (int64_t i = 0; i < n;) {
            const int64_t id = ids[i];
            if ((uint64_t)(id - o->special_low) > o->special_span) {
                i++;
                continue;
            }
            const int64_t next = i + 1 < n ? ids[i + 1] : INT64_MIN;
            OmniItem item = {i, 0, -1, 0, 0};
            if (id == o->vision_start && (next == o->image || next == o->video)) {
                const int is_image = next == o->image;
                if (is_image ? image >= o->images : (o->audio_in_video || video >= o->videos))
                    return OMNI_MISMATCH;
                item.kind = is_image ? OMNI_IMAGE : OMNI_VIDEO;
                item.media = is_image ? image++ : video++;
                const int64_t tokens = omni_vision_tokens(o, (is_image ? o->image_grid : o->video_grid) + 3 * item.media);
                if (tokens < 1 || tokens > n - i - 2 || count_token(ids + i + 1, tokens, next) != tokens ||
                    ids[i + 1 + tokens] != o->vision_end)
                    return OMNI_MISMATCH;
                item.tokens = tokens + 2;
            } else if (id == o->vision_start && next == o->audio_start) {
                if (!o->audio_in_video || video >= o->videos || audio >= o->audios)
                    return OMNI_MISMATCH;
                item.kind = OMNI_AUDIO_IN_VIDEO;
                item.media = video++;
                item.audio = audio++;
                const int64_t video_tokens = omni_vision_tokens(o, o->video_grid + 3 * item.media);
                const int64_t audio_tokens = omni_audio_tokens(o, o->audio_frames[item.audio]);
                if (video_tokens < 1 || audio_tokens < 1 || video_tokens > n - i - 4 ||
                    audio_tokens > n - i - 4 - video_tokens)
                    return OMNI_MISMATCH;
                const int64_t end = i + 2 + video_tokens + audio_tokens;  /* its audio end marker */
                /* transformers' Qwen2.5-Omni finds such a video by its first video token; vLLM reads none */
                if (count_token(ids + i + 2, end - i - 2, o->video) != video_tokens ||
                    count_token(ids + i + 2, end - i - 2, o->audio) != audio_tokens || ids[end] != o->audio_end ||
                    ids[end + 1] != o->vision_end || (!o->qwen3 && !o->vllm && ids[i + 2] != o->video))
                    return OMNI_MISMATCH;
                item.tokens = video_tokens + audio_tokens + 4;
                paired = 1;
            } else if (id == o->audio_start && next == o->audio) {
                if (audio >= o->audios)
                    return OMNI_MISMATCH;
                item.kind = OMNI_AUDIO;
                item.media = audio++;
                const int64_t tokens = omni_audio_tokens(o, o->audio_frames[item.media]);
                if (tokens < 1 || tokens > n - i - 2 || count_token(ids + i + 1, tokens, o->audio) != tokens ||
                    ids[i + 1 + tokens] != o->audio_end)
                    return OMNI_MISMATCH;
                item.tokens = tokens + 2;
                alone = 1;
            } else if (id == o->image || id == o->video || id == o->audio) {
                return OMNI_MISMATCH;  /* a placeholder outside any item */
            } else {
                i++;  /* text, or a start marker opening nothing */
                continue;
            }
            if (found == *capacity) {
                const Py_ssize_t grown = 2 * *capacity;
                OmniItem *moved = PyMem_RawRealloc(o->items, (size_t)grown * sizeof(OmniItem));
                if (!moved)
                    return -1;
                o->items = moved;
                *capacity = grown;
            }
            o->items[found++] = item;
            i += item.tokens;
        }
        if (o->vllm && paired && alone)  /* vLLM refuses such a request; the caller says why */
            return OMNI_MISMATCH;
    }
    o->first_item[o->samples] = found;
    return image == o->images && video == o->videos && audio == o->audios ? OMNI_WRITTEN : OMNI_MISMATCH;
}

/* Writing. Every value passes through omni_add, the reference's sum in its dtype. */
static double
omni_add(const Omni *o, double a, double b)
{
    return o->float32 ? (double)((float)a + (float)b) : a + b;
}

static double
omni_max(double a, double b)
{
    return a > b ? a : b;
}

VECTOR_CLONES static void
fill_f32(float *restrict out, Py_ssize_t count, float value)
{
    for (Py_ssize_t i = 0; i < count; i++)
        out[i] = value;
}

/* (float)(first + i) + start: an int64 arange plus a float32 scalar, as torch adds them
 * (indices are below 2**31: int32 converts to float in vector instructions). */
VECTOR_CLONES static void
ramp_f32(float *restrict out, int32_t count, int32_t first, float start)
{
    for (int32_t i = 0; i < count; i++)
        out[i] = (float)(first + i) + start;
}

/* One row of positions: `count` values from token `at` on. */
static void
omni_fill(const Omni *o, char *row, int64_t at, int64_t count, double value)
{
    if (o->float32)
        fill_f32((float *)row + at, count, (float)value);
    else
        fill((int64_t *)row + at, count, (int64_t)value);
}

/* (first + i) + start, i = 0 .. count - 1 */
static void
omni_ramp(const Omni *o, char *row, int64_t at, int64_t count, int64_t first, double start)
{
    if (o->float32)
        ramp_f32((float *)row + at, (int32_t)count, (int32_t)first, (float)start);
    else
        ramp((int64_t *)row + at, count, first + (int64_t)start);
}

/* Text (and audio) on the three rows. */
static void
omni_ramp3(const Omni *o, char *const row[3], int64_t at, int64_t count, int64_t first, double start)
{
    for (int r = 0; r < 3; r++)
        omni_ramp(o, row[r], at, count, first, start);
}

static void
omni_fill3(const Omni *o, char *const row[3], int64_t at, int64_t count, double value)
{
    for (int r = 0; r < 3; r++)
        omni_fill(o, row[r], at, count, value);
}

/* An image's or video's grid, placed from `start`. */
typedef struct {
    int64_t frames, height, width;  /* after merging */
    float seconds;  /* per grid; 1 for images */
    double start;
    int64_t pattern;  /* where its first frame's height and width rows were written, or -1 */
} OmniGrid;

/* A frame's temporal id: frame * seconds * positions per second in float32, truncated by
 * Qwen2.5-Omni; vLLM: frame * (seconds * positions per second) in float64, truncated. */
static double
omni_temporal(const Omni *o, const OmniGrid *g, int64_t frame)
{
    if (o->vllm)
        return (double)(int64_t)((double)frame * ((double)g->seconds * o->factor));
    const float scaled = (float)frame * g->seconds, temporal = scaled * o->per_second;
    return o->qwen3 ? (double)temporal : (double)(int64_t)temporal;
}

/* Its largest position on any axis (it includes its last token). */
static double
omni_grid_largest(const Omni *o, const OmniGrid *g)
{
    const double last_line = (double)(g->height - 1), last_column = (double)(g->width - 1);
    return omni_add(o, omni_max(omni_temporal(o, g, g->frames - 1), omni_max(last_line, last_column)), g->start);
}

static OmniGrid
omni_grid(const Omni *o, const int64_t *grid, float seconds, double start)
{
    return (OmniGrid){grid[0], grid[1] / o->merge, grid[2] / o->merge, seconds, start, -1};
}

/* Frame `frame` of a grid, whole, at token `at`: every frame's height and width rows are those
 * of the first frame written. */
static void
omni_frame(const Omni *o, char *const row[3], int64_t at, OmniGrid *g, int64_t frame)
{
    const int64_t per_frame = g->height * g->width;
    const size_t size = o->float32 ? 4 : 8;
    omni_fill(o, row[0], at, per_frame, omni_add(o, omni_temporal(o, g, frame), g->start));
    if (g->pattern >= 0) {
        for (int r = 1; r < 3; r++)
            memcpy(row[r] + at * size, row[r] + g->pattern * size, (size_t)per_frame * size);
        return;
    }
    for (int64_t line = 0; line < g->height; line++) {
        omni_fill(o, row[1], at + line * g->width, g->width, omni_add(o, (double)line, g->start));
        omni_ramp(o, row[2], at + line * g->width, g->width, 0, g->start);
    }
    g->pattern = at;
}

/* Tokens [from, to) of a grid, in its order, at token `at`. */
static void
omni_grid_range(const Omni *o, char *const row[3], int64_t at, OmniGrid *g, int64_t from, int64_t to)
{
    const int64_t per_frame = g->height * g->width;
    while (from < to) {
        const int64_t frame = from / per_frame, in_frame = from - frame * per_frame;
        if (in_frame == 0 && to - from >= per_frame) {
            omni_frame(o, row, at, g, frame);
            at += per_frame;
            from += per_frame;
            continue;
        }
        const int64_t line = in_frame / g->width, column = in_frame - line * g->width;
        const int64_t count = g->width - column < to - from ? g->width - column : to - from;
        omni_fill(o, row[0], at, count, omni_add(o, omni_temporal(o, g, frame), g->start));
        omni_fill(o, row[1], at, count, omni_add(o, (double)line, g->start));
        omni_ramp(o, row[2], at, count, column, g->start);
        at += count;
        from += count;
    }
}

/* Qwen3-Omni: a video's tokens and its audio's merged in order of temporal position, the
 * video's first on a tie. A frame's tokens share its time, so audio comes between frames only.
 * Returns the largest position of what the reference appends last (the audio's or the video's
 * tail). */
static double
omni_merge_by_time(const Omni *o, char *const row[3], int64_t at, OmniGrid *g, int64_t audio_tokens)
{
    int64_t heard = 0;
    for (int64_t frame = 0; frame < g->frames; frame++) {
        const double time = omni_add(o, omni_temporal(o, g, frame), g->start);
        int64_t until = heard;
        while (until < audio_tokens && omni_add(o, (double)until, g->start) < time)
            until++;
        omni_ramp3(o, row, at, until - heard, heard, g->start);
        at += until - heard;
        heard = until;
        omni_frame(o, row, at, g, frame);
        at += g->height * g->width;
    }
    omni_ramp3(o, row, at, audio_tokens - heard, heard, g->start);
    const double last_audio = omni_add(o, (double)(audio_tokens - 1), g->start);
    const double last_time = omni_add(o, omni_temporal(o, g, g->frames - 1), g->start);
    return last_audio >= last_time ? last_audio : omni_grid_largest(o, g);
}

/* Qwen2.5-Omni: the video and its audio cut into chunks of `chunk` positions (as
 * get_chunked_index cuts them: a new chunk at the first token whose temporal id, counted from
 * the start, reaches the next multiple of `chunk`, one new chunk per token at most), the video's
 * chunk j, then the audio's. Returns the largest position of the chunk placed last. */
static double
omni_merge_by_chunks(const Omni *o, char *const row[3], int64_t at, OmniGrid *g, int64_t audio_tokens)
{
    const int64_t per_frame = g->height * g->width, video_tokens = g->frames * per_frame;
    int64_t video_begin = 0, audio_begin = 0, tested = 0, reached = 1, video_chunks = 0, audio_chunks = 0;
    while (video_begin < video_tokens || audio_begin < audio_tokens) {
        if (video_begin < video_tokens) {
            int64_t end = video_tokens;
            while (tested < video_tokens) {  /* the next token that starts a chunk */
                const int64_t frame = tested / per_frame;
                if (omni_temporal(o, g, frame) >= (double)(reached * o->chunk)) {
                    end = tested++;
                    reached++;
                    break;
                }
                tested = (frame + 1) * per_frame;  /* the frame's other tokens have its temporal id */
            }
            omni_grid_range(o, row, at, g, video_begin, end);
            at += end - video_begin;
            video_begin = end;
            video_chunks++;
        }
        if (audio_begin < audio_tokens) {
            const int64_t end = audio_begin + o->chunk < audio_tokens ? audio_begin + o->chunk : audio_tokens;
            omni_ramp3(o, row, at, end - audio_begin, audio_begin, g->start);
            at += end - audio_begin;
            audio_begin = end;
            audio_chunks++;
        }
    }
    if (audio_chunks >= video_chunks)
        return omni_add(o, (double)(audio_tokens - 1), g->start);
    return omni_grid_largest(o, g);
}

/* vLLM's Qwen2.5-Omni interleave: the frames grouped by temporal id // `chunk` (a group
 * without frames takes nothing), each group's frames then the next `chunk` audio positions, the
 * audio left at the end. */
static void
omni_merge_by_groups(const Omni *o, char *const row[3], int64_t at, OmniGrid *g, int64_t audio_tokens)
{
    const int64_t per_frame = g->height * g->width;
    int64_t heard = 0;
    for (int64_t frame = 0; frame < g->frames;) {
        const int64_t group = (int64_t)omni_temporal(o, g, frame) / o->chunk;
        int64_t end = frame + 1;
        while (end < g->frames && (int64_t)omni_temporal(o, g, end) / o->chunk == group)
            end++;
        omni_grid_range(o, row, at, g, frame * per_frame, end * per_frame);
        at += (end - frame) * per_frame;
        const int64_t taken = audio_tokens - heard < o->chunk ? audio_tokens - heard : o->chunk;
        omni_ramp3(o, row, at, taken, heard, g->start);
        at += taken;
        heard += taken;
        frame = end;
    }
    omni_ramp3(o, row, at, audio_tokens - heard, heard, g->start);
}

/* The media between an item's markers from `start`; `largest` receives their largest
 * position. Returns the largest position of what the reference appends last (vLLM: the
 * largest). */
static double
omni_media(const Omni *o, const OmniItem *item, char *const row[3], int64_t at, double start, double *largest)
{
    if (item->kind == OMNI_AUDIO) {
        const int64_t tokens = item->tokens - 2;
        omni_ramp3(o, row, at, tokens, 0, start);
        return *largest = omni_add(o, (double)(tokens - 1), start);
    }
    const int is_image = item->kind == OMNI_IMAGE;
    OmniGrid g = omni_grid(o, (is_image ? o->image_grid : o->video_grid) + 3 * item->media,
                           is_image ? 1.0f : o->seconds[item->media], start);
    *largest = omni_grid_largest(o, &g);
    if (item->kind != OMNI_AUDIO_IN_VIDEO) {
        omni_grid_range(o, row, at, &g, 0, g.frames * g.height * g.width);
        return *largest;
    }
    const int64_t audio_tokens = item->tokens - 4 - g.frames * g.height * g.width;
    *largest = omni_max(*largest, omni_add(o, (double)(audio_tokens - 1), start));
    if (o->vllm) {  /* Qwen3-Omni: merged by integer time, which omni_temporal gives */
        if (o->qwen3)
            omni_merge_by_time(o, row, at, &g, audio_tokens);
        else
            omni_merge_by_groups(o, row, at, &g, audio_tokens);
        return *largest;
    }
    return o->qwen3 ? omni_merge_by_time(o, row, at, &g, audio_tokens) : omni_merge_by_chunks(o, row, at, &g, audio_tokens);
}

/* Sample s's positions on its three rows; returns its largest. */
static double
omni_sample(const Omni *o, Py_ssize_t s, char *const row[3])
{
    const int64_t count = o->count[s];
    if (o->text_only) {
        omni_ramp3(o, row, 0, count, 0, 0.0);
        return count ? (double)(count - 1) : -1.0;
    }
    double last = 0, largest = -1;  /* last: the largest position of the chunk placed last */
    int placed = 0;
    int64_t at = 0;
    for (Py_ssize_t i = o->first_item[s]; i < o->first_item[s + 1]; i++) {
        const OmniItem *item = &o->items[i];
        double start = placed ? omni_add(o, last, 1) : 0;
        const int64_t text = item->start - at;
        if (text) {
            omni_ramp3(o, row, at, text, 0, start);
            largest = omni_max(largest, omni_add(o, (double)(text - 1), start));
            start = omni_add(o, start, (double)text);
            at += text;
        }
        /* its start markers (two for a video with its audio): Qwen3-Omni counts on over them,
         * Qwen2.5-Omni gives both one position */
        const int pair = item->kind == OMNI_AUDIO_IN_VIDEO, counting = pair && o->qwen3;
        if (counting) {
            omni_ramp3(o, row, at, 2, 0, start);
            largest = omni_max(largest, omni_add(o, 1, start));
            start = omni_add(o, start, 2);
        } else {
            omni_fill3(o, row, at, 1 + pair, start);
            largest = omni_max(largest, start);
            start = omni_add(o, start, 1);
        }
        at += 1 + pair;
        double media;
        const double end = omni_add(o, omni_media(o, item, row, at, start, &media), 1);
        largest = omni_max(largest, media);
        at = item->start + item->tokens - 1 - pair;
        if (counting) {
            omni_ramp3(o, row, at, 2, 0, end);
            last = omni_add(o, 1, end);
        } else {
            omni_fill3(o, row, at, 1 + pair, end);
            last = end;
        }
        largest = omni_max(largest, last);
        at += 1 + pair;
        placed = 1;
    }
    if (at < count) {
        const double start = placed ? omni_add(o, last, 1) : 0;
        omni_ramp3(o, row, at, count - at, 0, start);
        largest = omni_max(largest, omni_add(o, (double)(count - at - 1), start));
    }
    return largest;
}

/* Sample s's positions as vLLM 0.33 computes them; returns its largest. vLLM places each
 * media block (an audio's or a grid's positions, or a video's and its audio's interleaved) one
 * past the largest position before it, and reads every other token as text counting on: the
 * start markers before a block, the end markers after it. Its block of a video with its audio
 * starts at the audio start marker; Qwen2.5-Omni's block is one token long at each end too, so
 * its last placeholder and both end markers count on from the block's largest + 1. */
static double
omni_sample_vllm(const Omni *o, Py_ssize_t s, char *const row[3])
{
    const int64_t count = o->count[s];
    double next = 0;  /* one past the largest position so far */
    int64_t at = 0;
    if (!o->text_only) {
        for (Py_ssize_t i = o->first_item[s]; i < o->first_item[s + 1]; i++) {
            const OmniItem *item = &o->items[i];
            const int pair = item->kind == OMNI_AUDIO_IN_VIDEO;
            const int64_t lead = item->start - at + 1 + (pair && o->qwen3);
            omni_ramp3(o, row, at, lead, 0, next);
            at += lead;
            double largest;
            omni_media(o, item, row, at, next + (double)lead, &largest);
            at += item->tokens - (pair ? 4 : 2);
            const int64_t tail = item->start + item->tokens - at;
            omni_ramp3(o, row, at, tail, 0, largest + 1);
            at += tail;
            next = largest + 1 + (double)tail;
        }
    }
    omni_ramp3(o, row, at, count - at, 0, next);
    return next + (double)(count - at) - 1;
}

typedef struct {
    const Omni *o;
    Py_ssize_t first_sample, end_sample;
} OmniWork;

static void *
omni_write(void *argument)
{
    const OmniWork *work = argument;
    const Omni *o = work->o;
    const size_t size = o->float32 ? 4 : 8;
    const Py_ssize_t length = o->length, rows = o->text_row ? 4 : 3;
    /* padding: 0 for Qwen3-Omni's placed positions, 1 for Qwen2.5-Omni's, for text-only
     * batches and in the text row */
    const double padding = o->qwen3 && !o->text_only ? 0 : 1;
    for (Py_ssize_t s = work->first_sample; s < work->end_sample; s++) {
        const int64_t first = o->first[s], count = o->count[s], b = first / length, column = first - b * length;
        char *row[4];
        for (Py_ssize_t r = 0; r < rows; r++)
            row[r] = o->out + (o->text_row ? (b * 4 + r) * length : (r * o->batch + b) * length) * size;
        char *const *positions = o->text_row ? row + 1 : row;
        char *at_sample[3];
        for (int r = 0; r < 3; r++)
            at_sample[r] = positions[r] + column * size;
        double largest = o->vllm ? omni_sample_vllm(o, s, at_sample) : omni_sample(o, s, at_sample);
        if (o->text_row)
            omni_ramp(o, row[0], column, count, 0, 0.0);
        if (o->one_per_row) {
            for (Py_ssize_t r = 0; r < rows; r++) {
                const double value = o->text_row && r == 0 ? 1 : padding;
                omni_fill(o, row[r], 0, column, value);
                omni_fill(o, row[r], column + count, length - column - count, value);
            }
            if (o->text_only && count < length && !o->vllm)  /* the reference's largest counts the padding's 1 */
                largest = omni_max(largest, 1);
        }
        const double delta = omni_add(o, omni_add(o, largest, 1), (double)-count);
        if (o->float32)
            ((float *)o->deltas)[s] = (float)delta;
        else
            ((int64_t *)o->deltas)[s] = (int64_t)delta;
    }
    return NULL;
}

/* Each row's valid tokens from a bool mask: one span per row, or -1 where padding lies
 * inside one. */
static int
omni_spans(const uint8_t *mask, Py_ssize_t batch, Py_ssize_t length, int64_t *first, int64_t *count)
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
        first[b] = b * length + (high > low ? low : 0);  /* a row of padding: no token, at its start */
        count[b] = high - low;
    }
    return 0;
}

PyDoc_STRVAR(omni_positions_doc,
"omni_positions(out, text_row, batch, length, ids, mask, first, count, tokens, flags, sizes,\n"
"               per_second, image_grid, video_grid, seconds, audio_frames, deltas, threads) -> status\n\n"
"An Omni thinker's positions written into `out` (float32 for Qwen3-Omni's reference, else int64;\n"
"(3, B, L), or (B, 4, L) with `text_row`, whose row 0 counts each sample's tokens from 0 and\n"
"holds 1 at padding), and each sample's largest position + 1 - its tokens into `deltas` (same dtype).\n"
"`ids`: int64 (B, L). Samples: `first` (flat index) and `count` (int64), covering the rows\n"
"back to back; or, both None, one per row: its valid tokens in `mask` (bool, or None: all).\n"
"`tokens`: (image, video, audio, vision start, vision end, audio start, audio end) ids;\n"
"`flags`: (Qwen3-Omni, use_audio_in_video, text only: no image or video grid, vLLM 0.33's\n"
"positions); `sizes`: (spatial merge, positions per chunk, audio window); `per_second`: temporal\n"
"positions per second. Media, in the batch's order:\n"
"`image_grid`, `video_grid` int64 (N, 3) or None, `seconds` float32 per video, `audio_frames`\n"
"int64 mel frames per audio. Returns 0 when written; 1 where tokens and media disagree, 2 for\n"
"padding inside a row, 3 for media that cannot be placed, 4 for a sample without tokens (1\n"
"also where vLLM refuses: an audio of its own beside a video with its audio in one sample).");

static PyObject *
omni_positions(PyObject *module, PyObject *args)
{
    PyObject *objects[10];  /* out, ids, mask, first, count, image_grid, video_grid, seconds, audio_frames, deltas */
    Omni o = {0};
    int text_row, threads;
    long long tokens[7], sizes[3];
    int flags[4];
    double per_second;
    if (!PyArg_ParseTuple(args, "OpnnOOOO(LLLLLLL)(pppp)(LLL)dOOOOOi:omni_positions", &objects[0], &text_row, &o.batch,
                          &o.length, &objects[1], &objects[2], &objects[3], &objects[4], &tokens[0], &tokens[1],
                          &tokens[2], &tokens[3], &tokens[4], &tokens[5], &tokens[6], &flags[0], &flags[1], &flags[2], &flags[3],
                          &sizes[0], &sizes[1], &sizes[2], &per_second, &objects[5], &objects[6], &objects[7],
                          &objects[8], &objects[9], &threads))
        return NULL;
    static const char *names[10] = {"out", "ids", "mask", "first", "count", "image_grid", "video_grid", "seconds",
                                    "audio_frames", "deltas"};
    static const Py_ssize_t itemsizes[10] = {0, 8, 1, 8, 8, 8, 8, 4, 8, 0};
    o.qwen3 = flags[0];
    o.audio_in_video = flags[1];
    o.text_only = flags[2];
    o.vllm = flags[3];
    o.float32 = o.qwen3 && !o.vllm;
    const Py_ssize_t value_size = o.float32 ? 4 : 8;
    Py_buffer views[10];
    int held[10] = {0};
    PyObject *result = NULL;
    int status = OMNI_WRITTEN;
    int64_t *spans = NULL;
    Py_ssize_t capacity = 64;
    for (int k = 0; k < 10; k++) {
        if (objects[k] == Py_None && k != 0 && k != 1 && k != 9)
            continue;
        if (acquire(objects[k], &views[k], k == 0 || k == 9, itemsizes[k] ? itemsizes[k] : value_size, names[k]) < 0)
            goto release;
        held[k] = 1;
    }
    const Py_ssize_t rows = text_row ? 4 : 3, tokens_given = o.batch * o.length;
    o.samples = held[3] ? views[3].len / 8 : o.batch;
    o.images = held[5] ? views[5].len / 24 : 0;
    o.videos = held[6] ? views[6].len / 24 : 0;
    o.audios = held[8] ? views[8].len / 8 : 0;
    if (o.batch < 1 || o.length < 1 || views[1].len / 8 != tokens_given || views[0].len / value_size != rows * tokens_given ||
        views[9].len / value_size != o.samples || held[3] != held[4] || (held[4] && views[4].len / 8 != o.samples) ||
        (held[2] && views[2].len != tokens_given) || (o.videos && (!held[7] || views[7].len / 4 != o.videos)) ||
        (held[5] && views[5].len % 24) || (held[6] && views[6].len % 24) || o.length > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "omni_positions: sizes do not fit a batch of %zd x %zd", o.batch, o.length);
        goto release;
    }
    o.ids = views[1].buf;
    o.out = views[0].buf;
    o.deltas = views[9].buf;
    o.text_row = text_row;
    o.image = tokens[0], o.video = tokens[1], o.audio = tokens[2], o.vision_start = tokens[3];
    o.vision_end = tokens[4], o.audio_start = tokens[5], o.audio_end = tokens[6];
    int64_t low = o.image, high = o.image;
    const int64_t special[5] = {o.image, o.video, o.audio, o.vision_start, o.audio_start};
    for (int k = 1; k < 5; k++) {
        low = special[k] < low ? special[k] : low;
        high = special[k] > high ? special[k] : high;
    }
    o.special_low = low;
    o.special_span = (uint64_t)(high - low);
    o.merge = sizes[0], o.chunk = sizes[1], o.n_window = sizes[2];
    o.per_second = (float)per_second;
    o.factor = per_second;
    o.image_grid = held[5] ? views[5].buf : NULL;
    o.video_grid = held[6] ? views[6].buf : NULL;
    o.seconds = held[7] ? views[7].buf : NULL;
    o.audio_frames = held[8] ? views[8].buf : NULL;
    if (!omni_media_fit(&o)) {
        status = OMNI_BAD_MEDIA;
        goto done;
    }
    o.first_item = PyMem_RawMalloc((size_t)(o.samples + 1) * sizeof(Py_ssize_t));
    o.items = PyMem_RawMalloc((size_t)capacity * sizeof(OmniItem));
    if (!held[3])
        spans = PyMem_RawMalloc((size_t)(2 * o.batch) * sizeof(int64_t));
    if (!o.first_item || !o.items || (!held[3] && !spans)) {
        PyErr_NoMemory();
        goto release;
    }
    if (held[3]) {
        o.first = views[3].buf;
        o.count = views[4].buf;
        for (Py_ssize_t s = 0; s < o.samples; s++)  /* back to back, each inside a row */
            if (o.count[s] < 0 || o.first[s] != (s ? o.first[s - 1] + o.count[s - 1] : 0) ||
                (o.count[s] && o.first[s] / o.length != (o.first[s] + o.count[s] - 1) / o.length)) {
                PyErr_Format(PyExc_ValueError, "omni_positions: sample %zd does not follow the one before in a row", s);
                goto release;
            }
        if (o.samples && o.first[o.samples - 1] + o.count[o.samples - 1] != tokens_given) {
            PyErr_SetString(PyExc_ValueError, "omni_positions: the samples do not cover the batch");
            goto release;
        }
    } else {
        o.one_per_row = 1;
        o.first = spans;
        o.count = spans + o.batch;
        if (held[2]) {
            int inside;
            Py_BEGIN_ALLOW_THREADS
            inside = omni_spans(views[2].buf, o.batch, o.length, spans, spans + o.batch);
            Py_END_ALLOW_THREADS
            if (inside) {
                status = OMNI_PADDING_INSIDE;
                goto done;
            }
        } else {
            for (Py_ssize_t b = 0; b < o.batch; b++)
                spans[b] = b * o.length, spans[o.batch + b] = o.length;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    status = omni_read(&o, &capacity);
    Py_END_ALLOW_THREADS
    if (status < 0) {
        PyErr_NoMemory();
        goto release;
    }
    if (status == OMNI_WRITTEN) {
        OmniWork work[MAX_THREADS];
        const Py_ssize_t workers = worker_count(rows * tokens_given, o.samples, threads);
        /* each worker the samples of about an equal share of the tokens */
        Py_ssize_t s = 0;
        for (Py_ssize_t w = 0; w < workers; w++) {
            const int64_t until = tokens_given * (w + 1) / workers;
            work[w] = (OmniWork){&o, s, s};
            while (work[w].end_sample < o.samples && (w == workers - 1 || o.first[work[w].end_sample] < until))
                work[w].end_sample++;
            s = work[w].end_sample;
        }
        Py_BEGIN_ALLOW_THREADS
        run_workers(omni_write, work, sizeof(OmniWork), workers);
        Py_END_ALLOW_THREADS
    }
done:
    result = PyLong_FromLong(status);
release:
    PyMem_RawFree(spans);
    PyMem_RawFree(o.items);
    PyMem_RawFree(o.first_item);
    for (int k = 0; k < 10; k++)
        if (held[k])
            PyBuffer_Release(&views[k]);
    return result;
}

/* The Qwen-style kernel's common case in one call (mrope_fused): the token ids are read once,
 * row by row, into each token's media type (up to MAX_MEDIA_TOKENS placeholder ids, or GLM's
 * image token turned video between begin- and end-of-video markers), each sample's span of
 * valid tokens and the runs of equal media type inside it; the runs take their kinds' grids in
 * order, their temporal ids are worked out as numpy works them out, and `positions`' writer
 * writes the rows. What does not fit the common case (mismatches, padding inside a sample, odd
 * sizes or scales) is handed back as a status: the caller's step-by-step path then says why. */

enum { FUSED_WRITTEN, FUSED_MISMATCH, FUSED_PADDING_INSIDE, FUSED_UNUSUAL, FUSED_NO_MEMORY };

#define FUSED_MAX_KINDS 8
/* Grid sizes above this are no image or video of any processor; they go the step-by-step way,
 * which also keeps every product below in int64. */
#define FUSED_MAX_SIDE (1 << 20)

typedef struct {
    int64_t *start, *length, *sample;
    int8_t *type;
    Py_ssize_t size, capacity;
} FusedRuns;

static int
fused_append(FusedRuns *runs, int64_t start, int64_t length, int8_t type, int64_t sample)
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
static int
fused_scan(const int8_t *types, Py_ssize_t begin, Py_ssize_t end, int64_t row_start, int64_t sample,
           FusedRuns *runs)
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
        if (fused_append(runs, row_start + i, j - i, type, sample) < 0)
            return -1;
        i = j;
    }
    return 0;
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

/* An image token is a video frame's (2) where more begin than end markers precede it, itself
 * included, counting from `begin` (the row's or the segment's start). */
#define MARKED_VIDEO(NAME, ID)                                                                 \
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
MARKED_VIDEO(marked_video_64, int64_t)
MARKED_VIDEO(marked_video_32, int32_t)

typedef struct {
    const char *ids;
    Py_ssize_t itemsize, batch, length;
    const uint8_t *mask;  /* or NULL: every token valid */
    const int64_t *bounds;  /* or NULL; else one row of `segments` segments */
    Py_ssize_t segments;
    int marked;  /* types: image tokens, video frames between markers */
    int64_t image, opens, closes;
    Py_ssize_t tokens;
    int64_t token[MAX_MEDIA_TOKENS];
    int8_t type[MAX_MEDIA_TOKENS];
    int64_t *first, *count;  /* written: each sample's span */
} FusedRead;

typedef struct {
    RowRange rows;
    const FusedRead *read;
    FusedRuns runs;
    int status;
} FusedReadWork;

static void
fused_types(const FusedRead *r, Py_ssize_t b, int8_t *types)
{
    const Py_ssize_t length = r->length;
    const char *ids = r->ids + b * length * r->itemsize;
    const int wide = r->itemsize == 8;
    if (!r->marked) {
        if (wide)
            type_rows_64((const int64_t *)ids, types, 0, length, r->token, r->type, r->tokens);
        else
            type_rows_32((const int32_t *)ids, types, 0, length, r->token, r->type, r->tokens);
        return;
    }
    const int8_t one = 1;
    if (wide)
        type_rows_64((const int64_t *)ids, types, 0, length, &r->image, &one, 1);
    else
        type_rows_32((const int32_t *)ids, types, 0, length, &r->image, &one, 1);
    if (!(wide ? any_equal_64((const int64_t *)ids, length, r->opens) : any_equal_32((const int32_t *)ids, length, r->opens)))
        return;  /* no video in this row */
    const Py_ssize_t pieces = r->bounds ? r->segments : 1;
    for (Py_ssize_t k = 0; k < pieces; k++) {
        const Py_ssize_t begin = r->bounds ? r->bounds[k] : 0, end = r->bounds ? r->bounds[k + 1] : length;
        if (wide)
            marked_video_64((const int64_t *)ids, types, begin, end, r->opens, r->closes);
        else
            marked_video_32((const int32_t *)ids, types, begin, end, r->opens, r->closes);
    }
}

static void *
fused_read_rows(void *argument)
{
    FusedReadWork *work = argument;
    const FusedRead *r = work->read;
    const Py_ssize_t length = r->length;
    int8_t *types = PyMem_RawMalloc((size_t)length);
    if (!types) {
        work->status = FUSED_NO_MEMORY;
        return NULL;
    }
    for (Py_ssize_t b = work->rows.first_row; b < work->rows.end_row && work->status == FUSED_WRITTEN; b++) {
        const int64_t row_start = (int64_t)b * length;
        fused_types(r, b, types);
        if (r->bounds) {  /* one packed row: each segment a sample */
            for (Py_ssize_t k = 0; k < r->segments; k++)
                if (fused_scan(types, r->bounds[k], r->bounds[k + 1], row_start, k, &work->runs) < 0) {
                    work->status = FUSED_NO_MEMORY;
                    break;
                }
            continue;
        }
        int64_t first = 0, count = length;
        if (r->mask && omni_spans(r->mask + row_start, 1, length, &first, &count) < 0) {
            work->status = FUSED_PADDING_INSIDE;
            break;
        }
        r->first[b] = row_start + first;
        r->count[b] = count;
        if (fused_scan(types, first, first + count, row_start, b, &work->runs) < 0)
            work->status = FUSED_NO_MEMORY;
    }
    PyMem_RawFree(types);
    return NULL;
}

/* A timed video's temporal scale: the dtype numpy gives `tokens_per_second * seconds` (the
 * seconds truncated first under the whole-seconds rule), and its value. */
typedef struct {
    enum { SCALE_F32, SCALE_F64, SCALE_I64 } dtype;
    float f32;
    double f64;
    int64_t i64;
} FusedScale;

typedef struct {
    const void *seconds;  /* float32 or float64 per video by `seconds_size`; NULL: 1 (int64) each */
    Py_ssize_t seconds_size;
    int whole_seconds, in_float64;  /* the temporal rule: seconds truncated first, or in float64 */
    int past_frames;  /* text after a run resumes past its last frame too */
    int given, per_second_is_int;  /* tokens per second given, as a Python int */
    double per_second;
    int64_t per_second_int;
} FusedTiming;

/* 0, or -1 for a scale the step-by-step path works out (and refuses where it must). */
static int
fused_scale(const FusedTiming *t, Py_ssize_t video, FusedScale *scale)
{
    if (!t->seconds || t->whole_seconds) {
        int64_t whole = 1;
        if (t->seconds) {
            const double s = t->seconds_size == 4 ? (double)((const float *)t->seconds)[video]
                                                  : ((const double *)t->seconds)[video];
            if (!(s >= 0 && s < 2147483648.0))
                return -1;
            whole = (int64_t)s;
        }
        if (t->per_second_is_int) {
            scale->dtype = SCALE_I64;
            scale->i64 = t->per_second_int * whole;
        } else {
            scale->dtype = SCALE_F64;
            scale->f64 = t->per_second * (double)whole;
        }
        return 0;
    }
    if (t->seconds_size == 4 && !t->in_float64) {  /* float32 seconds stay float32, tokens_per_second too */
        const float s = ((const float *)t->seconds)[video];
        if (!(s >= 0 && s < INFINITY))
            return -1;
        scale->dtype = SCALE_F32;
        scale->f32 = (float)t->per_second * s;
        return 0;
    }
    const double s = t->seconds_size == 4 ? (double)((const float *)t->seconds)[video]
                                          : ((const double *)t->seconds)[video];
    if (!(s >= 0 && s < INFINITY))
        return -1;
    scale->dtype = SCALE_F64;
    scale->f64 = t->per_second * s;
    return 0;
}

/* trunc(frame * scale) in the scale's dtype, as numpy computes it; -1 where it would not fit. */
static int
fused_temporal(const FusedScale *scale, int64_t frame, int64_t *id)
{
    double product;
    switch (scale->dtype) {
    case SCALE_I64:
        if (scale->i64 < 0 || scale->i64 > ((int64_t)1 << 40))
            return -1;
        *id = frame * scale->i64;
        return 0;
    case SCALE_F32: {
        const float single = (float)frame * scale->f32;
        product = single;
        break;
    }
    default:
        product = (double)frame * scale->f64;
    }
    if (!(product >= 0 && product < 4611686018427387904.0))
        return -1;
    *id = (int64_t)product;
    return 0;
}

typedef struct {
    int type;  /* its value among the token types */
    int per_frame;  /* each (t, h, w) grid stands for t runs of (1, h, w) */
    int timed;  /* temporal ids scaled by FusedTiming */
    const int64_t *grid;
    Py_ssize_t rows;
} FusedKind;

typedef struct {
    int64_t *height, *width, *frames, *temporal;  /* per run, and each run's frames' temporal ids */
    Py_ssize_t frames_total;
} FusedMatched;

/* Each run's grid: the runs of each kind take its grids in order. */
static int
fused_match(const FusedRuns *runs, const FusedKind *kinds, Py_ssize_t kind_count, int64_t merge,
            const FusedTiming *timing, FusedMatched *m)
{
    int kind_of[128];
    for (int t = 0; t < 128; t++)
        kind_of[t] = -1;
    Py_ssize_t found[FUSED_MAX_KINDS] = {0}, wanted[FUSED_MAX_KINDS] = {0}, frames_total = 0;
    for (Py_ssize_t k = 0; k < kind_count; k++) {
        kind_of[kinds[k].type] = (int)k;
        for (Py_ssize_t row = 0; row < kinds[k].rows; row++) {
            const int64_t *g = kinds[k].grid + 3 * row;
            for (int side = 0; side < 3; side++)
                if (g[side] < 1 || g[side] > FUSED_MAX_SIDE)
                    return FUSED_MISMATCH;
            if (g[1] % merge || g[2] % merge)
                return FUSED_MISMATCH;
            wanted[k] += kinds[k].per_frame ? g[0] : 1;
            frames_total += g[0];
        }
    }
    int64_t placeholders = 0;
    for (Py_ssize_t r = 0; r < runs->size; r++) {
        const int k = runs->type[r] >= 0 ? kind_of[runs->type[r]] : -1;
        if (k < 0)
            return FUSED_MISMATCH;
        found[k]++;
        placeholders += runs->length[r];
    }
    for (Py_ssize_t k = 0; k < kind_count; k++)
        if (found[k] != wanted[k])
            return FUSED_MISMATCH;
    if (frames_total > placeholders)  /* every frame takes a token: nothing is sized beyond the batch */
        return FUSED_MISMATCH;
    m->frames_total = frames_total;
    m->height = PyMem_RawMalloc((size_t)(3 * runs->size + frames_total + 1) * sizeof(int64_t));
    if (!m->height)
        return FUSED_NO_MEMORY;
    m->width = m->height + runs->size, m->frames = m->width + runs->size, m->temporal = m->frames + runs->size;
    Py_ssize_t row_of[FUSED_MAX_KINDS] = {0};
    int64_t frame_of[FUSED_MAX_KINDS] = {0};
    Py_ssize_t written = 0;
    for (Py_ssize_t r = 0; r < runs->size; r++) {
        const int k = kind_of[runs->type[r]];
        const FusedKind *kind = &kinds[k];
        const Py_ssize_t row = row_of[k];
        const int64_t *g = kind->grid + 3 * row;
        int64_t frames = g[0];
        if (kind->per_frame) {
            frames = 1;
            if (++frame_of[k] == g[0])
                row_of[k]++, frame_of[k] = 0;
        } else {
            row_of[k]++;
        }
        int64_t patches, merged;
        if (__builtin_mul_overflow(frames, g[1] * g[2], &patches) ||
            __builtin_mul_overflow(runs->length[r], merge * merge, &merged) || merged != patches)
            return FUSED_MISMATCH;
        m->height[r] = g[1] / merge, m->width[r] = g[2] / merge, m->frames[r] = frames;
        FusedScale scale = {SCALE_I64, 0, 0, 0};
        if (kind->timed && fused_scale(timing, row, &scale) < 0)
            return FUSED_UNUSUAL;
        for (int64_t f = 0; f < frames; f++, written++) {
            if (!kind->timed)
                m->temporal[written] = f;
            else if (fused_temporal(&scale, f, &m->temporal[written]) < 0)
                return FUSED_UNUSUAL;
        }
    }
    m->frames_total = written;
    return FUSED_WRITTEN;
}

/* The constants of a kernel: (tokens, types, markers, merge, kinds, per_second, rule, past_frames), the
 * rule 0 (scaled), 1 (whole seconds) or 2 (in float64). */
static int
fused_spec(PyObject *spec, FusedRead *read, int64_t *merge, FusedKind *kinds, Py_ssize_t *kind_count,
           FusedTiming *timing)
{
    PyObject *tokens, *types, *markers, *kind_specs, *per_second;
    long long merge_value;
    int rule, past_frames;
    if (!PyArg_ParseTuple(spec, "O!O!OLO!Oip:mrope_fused spec", &PyTuple_Type, &tokens, &PyTuple_Type, &types,
                          &markers, &merge_value, &PyTuple_Type, &kind_specs, &per_second, &rule, &past_frames))
        return -1;
    if (rule < 0 || rule > 2) {
        PyErr_SetString(PyExc_ValueError, "mrope_fused: the temporal rule is 0, 1 or 2");
        return -1;
    }
    *merge = merge_value;
    read->tokens = PyTuple_GET_SIZE(tokens);
    *kind_count = PyTuple_GET_SIZE(kind_specs);
    if (read->tokens > MAX_MEDIA_TOKENS || PyTuple_GET_SIZE(types) != read->tokens || *kind_count > FUSED_MAX_KINDS ||
        merge_value < 1) {
        PyErr_SetString(PyExc_ValueError, "mrope_fused: up to 16 tokens with as many types, up to 8 kinds, merge >= 1");
        return -1;
    }
    for (Py_ssize_t k = 0; k < read->tokens; k++) {
        read->token[k] = PyLong_AsLongLong(PyTuple_GET_ITEM(tokens, k));
        const long type = PyLong_AsLong(PyTuple_GET_ITEM(types, k));
        read->type[k] = (int8_t)type;
        if (!PyErr_Occurred() && (type < 1 || type > 127))
            PyErr_SetString(PyExc_ValueError, "mrope_fused: media types are 1 to 127");
    }
    read->marked = markers != Py_None;
    if (read->marked && !PyErr_Occurred())
        PyArg_ParseTuple(markers, "LLL:mrope_fused markers", (long long *)&read->image, (long long *)&read->opens,
                         (long long *)&read->closes);
    for (Py_ssize_t k = 0; k < *kind_count && !PyErr_Occurred(); k++) {
        if (PyArg_ParseTuple(PyTuple_GET_ITEM(kind_specs, k), "ipp:mrope_fused kind", &kinds[k].type,
                             &kinds[k].per_frame, &kinds[k].timed) &&
            (kinds[k].type < 1 || kinds[k].type > 127 || (kinds[k].timed && kinds[k].per_frame)))
            PyErr_SetString(PyExc_ValueError, "mrope_fused: kinds are types 1 to 127, timed or per frame");
    }
    timing->whole_seconds = rule == 1;
    timing->in_float64 = rule == 2;
    timing->past_frames = past_frames;
    timing->per_second_is_int = PyLong_CheckExact(per_second);
    timing->given = per_second != Py_None;
    if (timing->per_second_is_int && !PyErr_Occurred()) {
        timing->per_second_int = PyLong_AsLongLong(per_second);
        timing->per_second = (double)timing->per_second_int;
        if (!PyErr_Occurred() && (timing->per_second_int < -(1LL << 24) || timing->per_second_int > (1LL << 24)))
            PyErr_SetString(PyExc_ValueError, "mrope_fused: tokens per second beyond 2**24");
    } else if (PyFloat_CheckExact(per_second)) {
        timing->per_second = PyFloat_AS_DOUBLE(per_second);
    } else if (timing->given && !PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "mrope_fused: tokens per second is an int, a float or None");
    }
    return PyErr_Occurred() ? -1 : 0;
}

PyDoc_STRVAR(mrope_fused_doc,
"mrope_fused(out, deltas, text_row, ids, itemsize, batch, length, mask, bounds, grids, seconds, spec,\n"
"            threads) -> status\n\n"
"A Qwen-style kernel's positions from token ids in one call, written into `out` (int64; (3, B, L),\n"
"or (B, 4, L) with `text_row`, whose row 0 counts each sample's tokens from 0, 1 at padding) and\n"
"each sample's largest position + 1 - its tokens into `deltas` (int64 (S,), or None).\n"
"`ids`: (B, L) integers of `itemsize` bytes (8 or 4); `mask`: bool (B, L) or None; `bounds`:\n"
"None, or int64 (K + 1,) segment boundaries of one packed row (then the samples are its\n"
"segments). `spec`: (tokens, types, markers, merge, kinds, tokens_per_second, rule, past_frames):\n"
"token ids and their media types, or markers (image, video begin, video end) for video frames\n"
"that are image tokens between markers; kinds ((type, per_frame, timed), ...) with `grids`, one\n"
"int64 (N, 3) array or None each; `seconds` (float32 or float64 per video of the timed kind, or\n"
"None: 1 each) scale its temporal ids as trunc(frame * tokens_per_second * seconds) in numpy's\n"
"dtype. Returns 0 when written; 1 where runs and grids disagree, 2 for padding inside a sample,\n"
"3 for anything else the step-by-step path handles (layout, bounds, scales).");

static PyObject *
mrope_fused(PyObject *module, PyObject *args)
{
    PyObject *out_obj, *deltas_obj, *ids_obj, *mask_obj, *bounds_obj, *grids_obj, *seconds_obj, *spec;
    Py_ssize_t itemsize, batch, length;
    int text_row, threads;
    if (!PyArg_ParseTuple(args, "OOpOnnnOOO!OOi:mrope_fused", &out_obj, &deltas_obj, &text_row, &ids_obj, &itemsize,
                          &batch, &length, &mask_obj, &bounds_obj, &PyTuple_Type, &grids_obj, &seconds_obj, &spec,
                          &threads))
        return NULL;
    FusedRead read = {0};
    FusedKind kinds[FUSED_MAX_KINDS] = {{0}};
    FusedTiming timing = {0};
    Py_ssize_t kind_count;
    int64_t merge;
    if (fused_spec(spec, &read, &merge, kinds, &kind_count, &timing) < 0)
        return NULL;
    if (PyTuple_GET_SIZE(grids_obj) != kind_count) {
        PyErr_SetString(PyExc_ValueError, "mrope_fused: one grid (or None) per kind");
        return NULL;
    }
    /* views: out, deltas, ids, mask, bounds, seconds, then the grids */
    enum { V_OUT, V_DELTAS, V_IDS, V_MASK, V_BOUNDS, V_SECONDS, V_GRIDS };
    Py_buffer views[V_GRIDS + FUSED_MAX_KINDS];
    int held[V_GRIDS + FUSED_MAX_KINDS] = {0};
    PyObject *objects[V_GRIDS + FUSED_MAX_KINDS] = {out_obj, deltas_obj, ids_obj, mask_obj, bounds_obj, seconds_obj};
    Py_ssize_t itemsizes[V_GRIDS + FUSED_MAX_KINDS] = {8, 8, itemsize, 1, 8, 1};
    for (Py_ssize_t k = 0; k < kind_count; k++)
        objects[V_GRIDS + k] = PyTuple_GET_ITEM(grids_obj, k), itemsizes[V_GRIDS + k] = 24;
    PyObject *result = NULL;
    int status = FUSED_WRITTEN;
    FusedReadWork work[MAX_THREADS];
    Py_ssize_t readers = 0;
    FusedRuns joined = {0};
    FusedMatched matched = {0};
    int64_t *spans = NULL, *scratch = NULL;
    Py_ssize_t *first_run = NULL;
    if (itemsize != 8 && itemsize != 4) {
        PyErr_Format(PyExc_ValueError, "mrope_fused: ids of 4 or 8 bytes, not %zd", itemsize);
        return NULL;
    }
    for (Py_ssize_t v = 0; v < V_GRIDS + kind_count; v++) {
        if (objects[v] == Py_None && v != V_OUT && v != V_IDS)
            continue;
        if (acquire(objects[v], &views[v], v <= V_DELTAS, itemsizes[v], "mrope_fused") < 0)
            goto release;
        held[v] = 1;
    }
    if (held[V_SECONDS] && (views[V_SECONDS].itemsize != 4 && views[V_SECONDS].itemsize != 8)) {
        PyErr_SetString(PyExc_ValueError, "mrope_fused: seconds are float32 or float64");
        goto release;
    }
    const Py_ssize_t rows = text_row ? 4 : 3, tokens = batch * length;
    if (batch < 1 || length < 1 || views[V_IDS].len != tokens * itemsize || views[V_OUT].len != rows * tokens * 8 ||
        (held[V_MASK] && views[V_MASK].len != tokens)) {
        PyErr_Format(PyExc_ValueError, "mrope_fused: sizes do not fit a batch of %zd x %zd", batch, length);
        goto release;
    }
    read.ids = views[V_IDS].buf, read.itemsize = itemsize, read.batch = batch, read.length = length;
    read.mask = held[V_MASK] ? views[V_MASK].buf : NULL;
    for (Py_ssize_t k = 0; k < kind_count; k++) {
        kinds[k].grid = held[V_GRIDS + k] ? views[V_GRIDS + k].buf : NULL;
        kinds[k].rows = held[V_GRIDS + k] ? views[V_GRIDS + k].len / 24 : 0;
        if (kinds[k].timed && held[V_GRIDS + k]) {
            if (held[V_SECONDS] && views[V_SECONDS].len / views[V_SECONDS].itemsize != kinds[k].rows) {
                status = FUSED_UNUSUAL;  /* the step-by-step path says how many it needs */
                goto done;
            }
            if (!timing.given) {
                status = FUSED_UNUSUAL;  /* no tokens per second given */
                goto done;
            }
        }
    }
    timing.seconds = held[V_SECONDS] ? views[V_SECONDS].buf : NULL;
    timing.seconds_size = held[V_SECONDS] ? views[V_SECONDS].itemsize : 0;
    if (itemsize == 4) {  /* int32 ids are compared with int32 tokens */
        int64_t high = read.marked ? (read.image | read.opens | read.closes) : 0;
        for (Py_ssize_t k = 0; k < read.tokens; k++)
            high |= read.token[k];
        if (high < 0 || high > INT32_MAX) {
            status = FUSED_UNUSUAL;
            goto done;
        }
    }
    Py_ssize_t samples = batch;
    if (held[V_BOUNDS]) {
        const int64_t *bounds = views[V_BOUNDS].buf;
        const Py_ssize_t count = views[V_BOUNDS].len / 8;
        int fits = batch == 1 && !held[V_MASK] && count >= 2 && bounds[0] == 0 && bounds[count - 1] == length;
        for (Py_ssize_t k = 1; fits && k < count; k++)
            fits = bounds[k] > bounds[k - 1];
        if (!fits) {
            status = FUSED_UNUSUAL;
            goto done;
        }
        read.bounds = bounds, read.segments = samples = count - 1;
    }
    if (held[V_DELTAS] ? views[V_DELTAS].len != samples * 8 : !text_row) {
        PyErr_Format(PyExc_ValueError, "mrope_fused: deltas must hold %zd values", samples);
        goto release;
    }
    spans = PyMem_RawMalloc((size_t)(2 * samples) * sizeof(int64_t));
    if (!spans) {
        PyErr_NoMemory();
        goto release;
    }
    read.first = spans, read.count = spans + samples;
    if (read.bounds)
        for (Py_ssize_t k = 0; k < samples; k++)
            read.first[k] = read.bounds[k], read.count[k] = read.bounds[k + 1] - read.bounds[k];
    RowRange ranges[MAX_THREADS];
    readers = split_rows(ranges, batch, length, threads);
    for (Py_ssize_t w = 0; w < readers; w++)
        work[w] = (FusedReadWork){ranges[w], &read, {0}, FUSED_WRITTEN};
    Py_BEGIN_ALLOW_THREADS
    run_workers(fused_read_rows, work, sizeof(FusedReadWork), readers);
    Py_END_ALLOW_THREADS
    for (Py_ssize_t w = 0; w < readers; w++) {
        if (work[w].status == FUSED_NO_MEMORY) {
            PyErr_NoMemory();
            goto release;
        }
        if (work[w].status != FUSED_WRITTEN) {
            status = work[w].status;
            goto done;
        }
    }
    if (readers == 1) {
        joined = work[0].runs;
        work[0].runs = (FusedRuns){0};
    } else {
        for (Py_ssize_t w = 0; w < readers; w++)
            for (Py_ssize_t r = 0; r < work[w].runs.size; r++)
                if (fused_append(&joined, work[w].runs.start[r], work[w].runs.length[r], work[w].runs.type[r],
                                 work[w].runs.sample[r]) < 0) {
                    PyErr_NoMemory();
                    goto release;
                }
    }
    status = fused_match(&joined, kinds, kind_count, merge, &timing, &matched);
    if (status == FUSED_NO_MEMORY) {
        PyErr_NoMemory();
        goto release;
    }
    if (status != FUSED_WRITTEN)
        goto done;
    first_run = PyMem_RawMalloc((size_t)(samples + 1) * sizeof(Py_ssize_t));
    scratch = PyMem_RawMalloc((size_t)(2 * joined.size + 1) * sizeof(int64_t));
    if (!first_run || !scratch) {
        PyErr_NoMemory();
        goto release;
    }
    Layout layout = {read.first, read.count, samples, joined.start, joined.length, matched.height, matched.width,
                     matched.frames, matched.temporal, scratch, scratch + joined.size, first_run, timing.past_frames};
    if (lay_out(&layout, joined.size, joined.sample, matched.frames_total, batch, length,
                held[V_DELTAS] ? views[V_DELTAS].buf : NULL) < 0)
        goto release;
    const Py_ssize_t writers = worker_count(rows * tokens, rows * batch, threads);
    PositionWork writes[MAX_THREADS];
    for (Py_ssize_t w = 0; w < writers; w++)
        writes[w] = (PositionWork){views[V_OUT].buf, &layout, batch, length, text_row, w, writers};
    Py_BEGIN_ALLOW_THREADS
    run_workers(position_chunks, writes, sizeof(PositionWork), writers);
    Py_END_ALLOW_THREADS
done:
    result = PyLong_FromLong(status);
release:
    for (Py_ssize_t w = 0; w < readers; w++)
        PyMem_RawFree(work[w].runs.start);
    PyMem_RawFree(joined.start);
    PyMem_RawFree(matched.height);
    PyMem_RawFree(spans);
    PyMem_RawFree(scratch);
    PyMem_RawFree(first_run);
    for (Py_ssize_t v = 0; v < V_GRIDS + FUSED_MAX_KINDS; v++)
        if (held[v])
            PyBuffer_Release(&views[v]);
    return result;
}

static PyMethodDef methods[] = {
    {"coded", coded, METH_VARARGS, coded_doc},
    {"changes", changes, METH_O, changes_doc},
    {"positions", positions, METH_VARARGS, positions_doc},
    {"token_types", token_types, METH_VARARGS, token_types_doc},
    {"read_mask", read_mask, METH_VARARGS, read_mask_doc},
    {"omni_positions", omni_positions, METH_VARARGS, omni_positions_doc},
    {"mrope_fused", mrope_fused, METH_VARARGS, mrope_fused_doc},
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
