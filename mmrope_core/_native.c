/* mmrope_core._native: the loops over every token of a CPU batch, compiled.
 *
 * What the engine and the M-RoPE kernel do per token, each token read or written once here:
 * - read_mask: check an attention mask holds only 0 and 1, as bool;
 * - token_types: each token id's media type;
 * - coded: token types with -1 at padding, and changes: where that code changes;
 * - positions: the rows of positions, written from the media runs the changes give.
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
 * text after it `max(h, w)` past that start (merged grid lines). No counters, no steps. */
typedef struct {
    const int64_t *first, *count;  /* samples: flat index of the first token, number of tokens */
    Py_ssize_t samples;
    const int64_t *start, *length, *height, *width, *frames;  /* runs, in reading order */
    const int64_t *temporal;  /* each frame's temporal id, run after run */
    /* worked out by lay_out: */
    int64_t *position;  /* each run's first position */
    int64_t *frame_start;  /* where each run's temporal ids begin in `temporal` */
    Py_ssize_t *first_run;  /* the runs of sample s: first_run[s] to first_run[s + 1] */
} Layout;

enum { TEXT_ROW, T_ROW, H_ROW, W_ROW };

/* Where the text after run r goes on: `max(h, w)` past the run's first position. */
static int64_t
after_run(const Layout *layout, Py_ssize_t r)
{
    const int64_t height = layout->height[r], width = layout->width[r];
    return layout->position[r] + (height > width ? height : width);
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
            if (start < at || start + layout->length[r] > end || frames < 1 || layout->height[r] < 1 ||
                layout->width[r] < 1 || frames * layout->height[r] * layout->width[r] != layout->length[r] ||
                frames_seen + frames > frames_given) {
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
    int text_row, threads;
    if (!PyArg_ParseTuple(args, "OnnpOOOOOOOOOOi:positions", &out_obj, &batch, &length, &text_row, &objects[0],
                          &objects[1], &objects[2], &objects[3], &objects[4], &objects[5], &objects[6], &objects[7],
                          &objects[8], &deltas_obj, &threads))
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
                     views[6].buf, views[7].buf, views[8].buf, scratch, scratch + runs, first_run};
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

static PyMethodDef methods[] = {
    {"coded", coded, METH_VARARGS, coded_doc},
    {"changes", changes, METH_O, changes_doc},
    {"positions", positions, METH_VARARGS, positions_doc},
    {"token_types", token_types, METH_VARARGS, token_types_doc},
    {"read_mask", read_mask, METH_VARARGS, read_mask_doc},
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
