/* The run-based kernel's common case in one call (mrope_fused): the token ids are read once,
 * row by row, into each token's media type (up to MAX_MEDIA_TOKENS placeholder ids, or one
 * placeholder whose type switches from 1 to 2 between begin and end markers), each sample's span of valid
 * tokens and the runs of equal media type inside it; the runs take their kinds' grids in order,
 * their temporal ids are worked out as numpy works them out, and rows.c writes the rows. What
 * does not fit the common case (mismatches, padding inside a sample, odd sizes or scales) is
 * handed back as a status: the caller's step-by-step path then says why. */
#include "native.h"

enum { FUSED_WRITTEN, FUSED_MISMATCH, FUSED_PADDING_INSIDE, FUSED_UNUSUAL, FUSED_NO_MEMORY };

#define FUSED_MAX_KINDS 8
/* Grid sizes above this are no image or video of any processor; they go the step-by-step way,
 * which also keeps every product below in int64. */
#define FUSED_MAX_SIDE (1 << 20)

typedef struct {
    const char *ids;
    Py_ssize_t itemsize, batch, length;
    const uint8_t *mask;  /* or NULL: every token valid */
    const int64_t *bounds;  /* or NULL; else one row of `segments` segments */
    Py_ssize_t segments;
    int switched;  /* types: one placeholder, 1 outside and 2 between begin and end markers */
    int64_t placeholder, opens, closes;
    Py_ssize_t tokens;
    int64_t token[MAX_MEDIA_TOKENS];
    int8_t type[MAX_MEDIA_TOKENS];
    int64_t *first, *count;  /* written: each sample's span */
} FusedRead;

typedef struct {
    RowRange rows;
    const FusedRead *read;
    Runs runs;
    int status;
} FusedReadWork;

static void
fused_types(const FusedRead *r, Py_ssize_t b, int8_t *types)
{
    const Py_ssize_t length = r->length;
    const char *ids = r->ids + b * length * r->itemsize;
    const int wide = r->itemsize == 8;
    if (!r->switched) {
        if (wide)
            type_rows_64((const int64_t *)ids, types, 0, length, r->token, r->type, r->tokens);
        else
            type_rows_32((const int32_t *)ids, types, 0, length, r->token, r->type, r->tokens);
        return;
    }
    const int8_t one = 1;
    if (wide)
        type_rows_64((const int64_t *)ids, types, 0, length, &r->placeholder, &one, 1);
    else
        type_rows_32((const int32_t *)ids, types, 0, length, &r->placeholder, &one, 1);
    if (!any_equal(ids, r->itemsize, length, r->opens))
        return;  /* no begin marker in this row */
    const Py_ssize_t pieces = r->bounds ? r->segments : 1;
    for (Py_ssize_t k = 0; k < pieces; k++) {
        const Py_ssize_t begin = r->bounds ? r->bounds[k] : 0, end = r->bounds ? r->bounds[k + 1] : length;
        between_markers(ids, r->itemsize, types, begin, end, r->opens, r->closes);
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
                if (runs_scan(types, r->bounds[k], r->bounds[k + 1], row_start, k, &work->runs) < 0) {
                    work->status = FUSED_NO_MEMORY;
                    break;
                }
            continue;
        }
        int64_t first = 0, count = length;
        if (r->mask && mask_spans(r->mask + row_start, 1, length, &first, &count) < 0) {
            work->status = FUSED_PADDING_INSIDE;
            break;
        }
        r->first[b] = row_start + first;
        r->count[b] = count;
        if (runs_scan(types, first, first + count, row_start, b, &work->runs) < 0)
            work->status = FUSED_NO_MEMORY;
    }
    PyMem_RawFree(types);
    return NULL;
}

typedef struct {
    const void *seconds;  /* float32 or float64 per video by `seconds_size`; NULL: 1 (int64) each */
    Py_ssize_t seconds_size;
    int frame_first, precision, whole_seconds;  /* the temporal rule's fields */
    int of_seconds;  /* its precision is the seconds' dtype (else `precision`) */
    int past_frames;  /* text after a run resumes past its last frame too */
    int given, per_second_is_int;  /* per_second given, as a Python int */
    double per_second;
} FusedTiming;

/* A timed video's temporal scale under the rule, in the arithmetic numpy gives it (see
 * temporal_rule_for; no seconds given: one whole second each); -1 for one the step-by-step path
 * works out (and refuses where it must). */
static int
fused_scale(const FusedTiming *t, Py_ssize_t video, TemporalScale *scale)
{
    const TemporalRule given = {t->per_second, t->frame_first, t->of_seconds ? PRECISION_SECONDS : t->precision, 1,
                                t->whole_seconds, t->per_second_is_int};
    double seconds = 1.0;
    if (t->seconds)
        seconds = t->seconds_size == 4 ? (double)((const float *)t->seconds)[video] : ((const double *)t->seconds)[video];
    const TemporalRule rule = temporal_rule_for(
        &given, !t->seconds ? SECONDS_INT64 : t->seconds_size == 4 ? SECONDS_FLOAT32 : SECONDS_FLOAT64);
    return temporal_scale(&rule, seconds, scale);
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
fused_match(const Runs *runs, const FusedKind *kinds, Py_ssize_t kind_count, int64_t merge,
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
        TemporalScale scale;
        if (kind->timed && fused_scale(timing, row, &scale) < 0)
            return FUSED_UNUSUAL;
        for (int64_t f = 0; f < frames; f++, written++) {
            if (!kind->timed)
                m->temporal[written] = f;
            else if (temporal_truncated(&scale, f, &m->temporal[written]) < 0)
                return FUSED_UNUSUAL;
        }
    }
    m->frames_total = written;
    return FUSED_WRITTEN;
}

/* The constants of a kernel: (tokens, types, markers, merge, kinds, per_second, frame_first, precision,
 * whole_seconds, past_frames), the temporal rule's fields with its precision 0 (float32), 1 (float64)
 * or 2 (the seconds' dtype). */
static int
fused_spec(PyObject *spec, FusedRead *read, int64_t *merge, FusedKind *kinds, Py_ssize_t *kind_count,
           FusedTiming *timing)
{
    PyObject *tokens, *types, *markers, *kind_specs, *per_second;
    long long merge_value;
    int frame_first, precision, whole_seconds, past_frames;
    if (!PyArg_ParseTuple(spec, "O!O!OLO!Opipp:mrope_fused spec", &PyTuple_Type, &tokens, &PyTuple_Type, &types,
                          &markers, &merge_value, &PyTuple_Type, &kind_specs, &per_second, &frame_first, &precision,
                          &whole_seconds, &past_frames))
        return -1;
    if (precision < 0 || precision > 2) {
        PyErr_SetString(PyExc_ValueError, "mrope_fused: the temporal precision is 0, 1 or 2");
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
    read->switched = markers != Py_None;
    if (read->switched && !PyErr_Occurred())
        PyArg_ParseTuple(markers, "LLL:mrope_fused markers", (long long *)&read->placeholder, (long long *)&read->opens,
                         (long long *)&read->closes);
    for (Py_ssize_t k = 0; k < *kind_count && !PyErr_Occurred(); k++) {
        if (PyArg_ParseTuple(PyTuple_GET_ITEM(kind_specs, k), "ipp:mrope_fused kind", &kinds[k].type,
                             &kinds[k].per_frame, &kinds[k].timed) &&
            (kinds[k].type < 1 || kinds[k].type > 127 || (kinds[k].timed && kinds[k].per_frame)))
            PyErr_SetString(PyExc_ValueError, "mrope_fused: kinds are types 1 to 127, timed or per frame");
    }
    timing->frame_first = frame_first;
    timing->of_seconds = precision == 2;
    timing->precision = precision == 1 ? PRECISION_FLOAT64 : PRECISION_FLOAT32;
    timing->whole_seconds = whole_seconds;
    timing->past_frames = past_frames;
    timing->per_second_is_int = PyLong_CheckExact(per_second);
    timing->given = per_second != Py_None;
    if (timing->per_second_is_int && !PyErr_Occurred()) {
        const long long whole = PyLong_AsLongLong(per_second);
        timing->per_second = (double)whole;
        if (!PyErr_Occurred() && (whole < -(1LL << 24) || whole > (1LL << 24)))
            PyErr_SetString(PyExc_ValueError, "mrope_fused: per_second beyond 2**24");
    } else if (PyFloat_CheckExact(per_second)) {
        timing->per_second = PyFloat_AS_DOUBLE(per_second);
    } else if (timing->given && !PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "mrope_fused: per_second is an int, a float or None");
    }
    return PyErr_Occurred() ? -1 : 0;
}

const char mrope_fused_doc[] =
"mrope_fused(out, deltas, text_row, ids, itemsize, batch, length, mask, bounds, grids, seconds, spec,\n"
"            threads) -> status\n\n"
"A run-based kernel's positions from token ids in one call, written into `out` (int64; (3, B, L),\n"
"or (B, 4, L) with `text_row`, whose row 0 counts each sample's tokens from 0, 1 at padding) and\n"
"each sample's largest position + 1 - its tokens into `deltas` (int64 (S,), or None).\n"
"`ids`: (B, L) integers of `itemsize` bytes (8 or 4); `mask`: bool (B, L) or None; `bounds`:\n"
"None, or int64 (K + 1,) segment boundaries of one packed row (then the samples are its\n"
"segments). `spec`: (tokens, types, markers, merge, kinds, per_second, frame_first, precision,\n"
"whole_seconds, past_frames):\n"
"token ids and their media types, or (placeholder, begin, end) for one placeholder typed 1, and 2\n"
"between begin and end markers; kinds ((type, per_frame, timed), ...) with `grids`, one\n"
"int64 (N, 3) array or None each; `seconds` (float32 or float64 per video of the timed kind, or\n"
"None: 1 each) scale its temporal ids by the temporal rule of the next four (per_second None:\n"
"untimed; precision 0 float32, 1 float64, 2 the seconds' dtype), truncated. Returns 0 when written; 1 where runs and grids disagree, 2 for padding inside a sample,\n"
"3 for anything else the step-by-step path handles (layout, bounds, scales).";

PyObject *
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
    Runs joined = {0};
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
                status = FUSED_UNUSUAL;  /* no per_second given */
                goto done;
            }
        }
    }
    timing.seconds = held[V_SECONDS] ? views[V_SECONDS].buf : NULL;
    timing.seconds_size = held[V_SECONDS] ? views[V_SECONDS].itemsize : 0;
    if (itemsize == 4) {  /* int32 ids are compared with int32 tokens */
        int64_t high = read.switched ? (read.placeholder | read.opens | read.closes) : 0;
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
    Runs parts[MAX_THREADS];
    for (Py_ssize_t w = 0; w < readers; w++) {
        if (work[w].status == FUSED_NO_MEMORY) {
            PyErr_NoMemory();
            goto release;
        }
        if (work[w].status != FUSED_WRITTEN) {
            status = work[w].status;
            goto done;
        }
        parts[w] = work[w].runs;
    }
    int joined_ok = runs_join(&joined, parts, readers) == 0;
    for (Py_ssize_t w = 0; w < readers; w++)
        work[w].runs = parts[w];  /* what is left of them, freed below */
    if (!joined_ok) {
        PyErr_NoMemory();
        goto release;
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
    RunLayout layout = {read.first, read.count, samples, joined.start, joined.length, matched.height, matched.width,
                        matched.frames, matched.temporal, scratch, scratch + joined.size, first_run, timing.past_frames};
    if (lay_out(&layout, joined.size, joined.sample, matched.frames_total, batch, length,
                held[V_DELTAS] ? views[V_DELTAS].buf : NULL) < 0)
        goto release;
    write_rows(views[V_OUT].buf, &layout, batch, length, text_row, threads);
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
