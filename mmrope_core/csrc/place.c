/* Placing media items by a layout given as data: compiling the layout once, reading each
 * sample's items (items.c) and writing each position once, composed of blocks.c's ramps and
 * grids and interleave.c's merges. Every sum is made in the positions' dtype, in the order the
 * layout's reference makes it (float32 sums round as the reference's do). */
#include "native.h"

#include <math.h>
#include <string.h>

static const char CAPSULE[] = "mmrope_core._native.ItemLayout";

/* ---- compiling a layout ---------------------------------------------------------------- */

static int
tokens_of(PyObject *tuple, int64_t *out, int most, int *length, const char *what)
{
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) > most) {
        PyErr_Format(PyExc_ValueError, "compile_layout: %s is a tuple of at most %d tokens", what, most);
        return -1;
    }
    *length = (int)PyTuple_GET_SIZE(tuple);
    for (int j = 0; j < *length; j++) {
        out[j] = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, j));
        if (PyErr_Occurred())
            return -1;
    }
    return 0;
}

static int
medium_of(PyObject *spec, MediumSpec *medium)
{
    PyObject *steps;
    long long merge, window, per_window;
    if (!PyArg_ParseTuple(spec, "iLpO!LL|ppp:compile_layout medium", &medium->type, &merge, &medium->timed,
                          &PyTuple_Type, &steps, &window, &per_window, &medium->stamped, &medium->per_frame,
                          &medium->unscaled))
        return -1;
    medium->merge = merge, medium->rule.window = window, medium->rule.per_window = per_window;
    medium->rule.steps = (int)PyTuple_GET_SIZE(steps);
    int fits = (medium->type == MEDIA_GRID || medium->type == MEDIA_SEQUENCE) && merge >= 1 && merge <= (1 << 20) &&
               medium->rule.steps <= MAX_STEPS && window >= 0 && window <= (1 << 20) && per_window >= 0 &&
               per_window <= 64 * window && !(medium->stamped && (medium->timed || medium->type != MEDIA_GRID)) &&
               !(medium->per_frame && (medium->timed || medium->stamped || medium->type != MEDIA_GRID)) &&
               !(medium->unscaled && (medium->timed || medium->stamped || medium->type != MEDIA_GRID));
    for (int k = 0; fits && k < medium->rule.steps; k++) {
        long long drop, stride;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(steps, k), "LL:compile_layout step", &drop, &stride))
            return -1;
        medium->rule.drop[k] = drop, medium->rule.stride[k] = stride;
        medium->rule.shift[k] = stride >= 1 && (stride & (stride - 1)) == 0 ? __builtin_ctzll((unsigned long long)stride) : -1;
        fits = drop >= 0 && drop <= (1 << 20) && stride >= 1 && stride <= (1 << 20);
    }
    if (!fits)
        PyErr_SetString(PyExc_ValueError, "compile_layout: a medium out of range");
    return fits ? 0 : -1;
}

static int
kind_of(PyObject *spec, const ItemLayout *layout, KindSpec *kind)
{
    PyObject *key, *media, *placeholders, *closing, *first, *inside = Py_None;
    long long chunk, exclusive;
    if (!PyArg_ParseTuple(spec, "O!iO!O!O!OpiiLiL|pO:compile_layout kind", &PyTuple_Type, &key, &kind->opening,
                          &PyTuple_Type, &media, &PyTuple_Type, &placeholders, &PyTuple_Type, &closing, &first,
                          &kind->share_markers, &kind->lead, &kind->interleave, &chunk, &kind->resume, &exclusive,
                          &kind->whole_run, &inside))
        return -1;
    int count, markers = 0;
    if (tokens_of(key, kind->key, MAX_KEY, &kind->key_length, "a key") < 0 ||
        tokens_of(closing, kind->closing, MAX_CLOSING, &kind->closing_length, "a closing") < 0 ||
        tokens_of(placeholders, kind->placeholder, 2, &kind->media_count, "placeholders") < 0 ||
        (inside != Py_None && tokens_of(inside, kind->inside, 2, &markers, "inside") < 0))
        return -1;
    kind->has_inside = inside != Py_None;
    int64_t media_values[2];
    if (tokens_of(media, media_values, 2, &count, "media") < 0)
        return -1;
    kind->has_first = first != Py_None;
    kind->first = kind->has_first ? PyLong_AsLongLong(first) : 0;
    if (PyErr_Occurred())
        return -1;
    kind->chunk = chunk;
    kind->exclusive = (uint32_t)exclusive;
    int fits = count == kind->media_count && count >= 1 && kind->key_length >= 1 && kind->opening >= 0 &&
               kind->opening <= kind->key_length && kind->lead >= 0 && kind->lead <= kind->opening &&
               exclusive >= 0 && exclusive < (1LL << MAX_KINDS) && kind->resume >= RESUME_LARGEST &&
               kind->resume <= RESUME_SPATIAL &&
               (!kind->has_inside || (markers == 2 && kind->inside[0] != kind->inside[1]));
    for (int m = 0; fits && m < count; m++) {
        kind->medium[m] = (int)media_values[m];
        fits = media_values[m] >= 0 && media_values[m] < layout->media_count;
    }
    if (fits && count == 2)  /* a grid and a sequence, interleaved */
        fits = layout->medium[kind->medium[0]].type == MEDIA_GRID &&
               layout->medium[kind->medium[1]].type == MEDIA_SEQUENCE && kind->interleave >= INTERLEAVE_TIME &&
               kind->interleave <= INTERLEAVE_GROUPS && (kind->interleave == INTERLEAVE_TIME || chunk >= 1);
    if (fits && count == 1)
        fits = kind->interleave == INTERLEAVE_NONE &&
               (kind->resume != RESUME_SPATIAL || layout->medium[kind->medium[0]].type == MEDIA_GRID);
    if (fits && count == 2)
        fits = kind->resume != RESUME_SPATIAL;
    if (!fits)
        PyErr_SetString(PyExc_ValueError, "compile_layout: a kind out of range");
    return fits ? 0 : -1;
}

/* The tokens reading stops at for `kind`: its key's first, its placeholders, its inside markers. */
static int
special_tokens(const KindSpec *kind, int64_t *tokens)
{
    int count = 0;
    tokens[count++] = kind->key[0];
    for (int m = 0; m < kind->media_count; m++)
        tokens[count++] = kind->placeholder[m];
    for (int j = 0; kind->has_inside && j < 2; j++)
        tokens[count++] = kind->inside[j];
    return count;
}

static void
layout_free(PyObject *capsule)
{
    PyMem_Free(PyCapsule_GetPointer(capsule, CAPSULE));
}

const char compile_layout_doc[] =
"compile_layout(media, kinds, temporal, values) -> capsule\n\n"
"A layout of media items, checked once, for place_items and find_items.\n"
"media: ((type 0 grid / 1 sequence, merge, timed, steps ((drop, stride), ...), window, per_window,\n"
"        stamped, per_frame, unscaled), ...);\n"
"kinds: ((key, opening, media, placeholders, closing, first or None, share_markers, lead,\n"
"        interleave 0 none / 1 time / 2 chunks / 3 groups, chunk,\n"
"        resume 0 largest / 1 last / 2 spatial, exclusive, whole_run, inside (begin, end) or None), ...);\n"
"temporal: (per_second, frame_first, precision 0 float32 / 1 float64 / 2 the seconds' dtype, truncate,\n"
"          whole_seconds, per_second_whole);\n"
"values: (form 0 int64 / 1 float32 / 2 float32 written truncated to int64, padding, padding_in_largest,\n"
"         text_only, refuse_empty).";

PyObject *
compile_layout(PyObject *module, PyObject *args)
{
    PyObject *media, *kinds;
    ItemLayout *l = PyMem_Calloc(1, sizeof(ItemLayout));
    if (!l)
        return PyErr_NoMemory();
    TemporalRule *rule = &l->temporal;
    if (!PyArg_ParseTuple(args, "O!O!(dpippp)(idppp):compile_layout", &PyTuple_Type, &media, &PyTuple_Type, &kinds,
                          &rule->per_second, &rule->frame_first, &rule->precision, &rule->truncate,
                          &rule->whole_seconds, &rule->per_second_whole, &l->form, &l->padding,
                          &l->padding_in_largest, &l->text_only, &l->refuse_empty))
        goto failed;
    l->media_count = (int)PyTuple_GET_SIZE(media);
    l->kind_count = (int)PyTuple_GET_SIZE(kinds);
    /* a whole per_second is multiplied in int64: one whose products with any seconds fit */
    if (l->media_count > MAX_LAYOUT_MEDIA || l->kind_count > MAX_KINDS || !isfinite(rule->per_second) ||
        rule->precision < 0 || rule->precision > 2 ||
        (rule->per_second_whole && !(fabs(rule->per_second) < 16777216.0)) || l->form < FORM_INT64 ||
        l->form > FORM_TRUNCATED || (l->form == FORM_INT64 && !rule->truncate)) {
        PyErr_SetString(PyExc_ValueError, "compile_layout: too many media or kinds, or a rule out of range");
        goto failed;
    }
    if (rule->precision == 2)
        rule->precision = PRECISION_SECONDS;
    for (int m = 0; m < l->media_count; m++) {
        if (medium_of(PyTuple_GET_ITEM(media, m), &l->medium[m]) < 0)
            goto failed;
        if (l->medium[m].stamped && (rule->precision == PRECISION_SECONDS || rule->whole_seconds)) {
            PyErr_SetString(PyExc_ValueError, "compile_layout: stamps are scaled in float32 or float64");
            goto failed;
        }
    }
    int64_t low = INT64_MAX, high = INT64_MIN;
    for (int k = 0; k < l->kind_count; k++) {
        KindSpec *kind = &l->kind[k];
        if (kind_of(PyTuple_GET_ITEM(kinds, k), l, kind) < 0)
            goto failed;
        int64_t special[5];
        const int count = special_tokens(kind, special);
        for (int j = 0; j < count; j++) {
            low = special[j] < low ? special[j] : low;
            high = special[j] > high ? special[j] : high;
        }
        l->has_inside |= kind->has_inside;
    }
    l->special_low = l->kind_count ? low : 0;
    l->special_span = l->kind_count ? (uint64_t)high - (uint64_t)low : 0;
    for (int k = 0; k < l->kind_count; k++) {
        const KindSpec *kind = &l->kind[k];
        int64_t special[5];
        const int count = special_tokens(kind, special);
        for (int j = 0; j < count && l->special_span < SPECIAL_BITS; j++) {
            const uint64_t offset = (uint64_t)special[j] - (uint64_t)low;
            l->special[offset >> 6] |= (uint64_t)1 << (offset & 63);
        }
    }
    return PyCapsule_New(l, CAPSULE, layout_free);
failed:
    PyMem_Free(l);
    return NULL;
}

ItemLayout *
layout_of(PyObject *capsule)
{
    return PyCapsule_GetPointer(capsule, CAPSULE);
}

/* ---- a call's samples and media, read ---------------------------------------------------- */

typedef struct {
    ItemRead read;
    Py_buffer view[4 + 2 * MAX_LAYOUT_MEDIA];  /* ids, mask, first, count, then media and seconds */
    int held[4 + 2 * MAX_LAYOUT_MEDIA];
    int64_t *spans;
    int one_per_row;  /* each row holds one sample with padding around it (else samples cover the rows) */
} Reading;

enum { R_IDS, R_MASK, R_FIRST, R_COUNT, R_MEDIA };

static void
reading_release(Reading *c)
{
    PyMem_RawFree(c->spans);
    for (int m = 0; m < MAX_LAYOUT_MEDIA; m++)
        PyMem_RawFree(c->read.stamp_first[m]);
    PyMem_RawFree(c->read.items);
    PyMem_RawFree(c->read.first_item);
    for (int k = 0; k < 4 + 2 * MAX_LAYOUT_MEDIA; k++)
        if (c->held[k])
            PyBuffer_Release(&c->view[k]);
}

static int
hold(Reading *c, int k, PyObject *object, Py_ssize_t itemsize, const char *name)
{
    if (acquire(object, &c->view[k], 0, itemsize, name) < 0)
        return -1;
    c->held[k] = 1;
    return 0;
}

/* The SECONDS_* dtype of a buffer of seconds, or -1. */
static int
seconds_type(const Py_buffer *view)
{
    const char *format = view->format ? view->format : "B";
    format += *format == '@' || *format == '=';  /* native order, as numpy leaves it unsaid */
    if (view->itemsize == 4 && !strcmp(format, "f"))
        return SECONDS_FLOAT32;
    if (view->itemsize == 8 && !strcmp(format, "d"))
        return SECONDS_FLOAT64;
    if (view->itemsize == 8 && (!strcmp(format, "l") || !strcmp(format, "q")))
        return SECONDS_INT64;
    return -1;
}

/* Timed medium `m`'s seconds held in their dtype (float32, float64 or int64): 1 for one a grid,
 * 0 for another count, -1 with an exception set. */
static int
hold_seconds(Reading *c, int m, PyObject *seconds)
{
    const int k = R_MEDIA + MAX_LAYOUT_MEDIA + m;
    if (PyObject_GetBuffer(seconds, &c->view[k], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    c->held[k] = 1;
    const int type = seconds_type(&c->view[k]);
    if (type < 0) {
        PyErr_Format(PyExc_ValueError, "seconds: float32, float64 or int64, not format '%s'",
                     c->view[k].format ? c->view[k].format : "B");
        return -1;
    }
    c->read.seconds[m] = c->view[k].buf;
    c->read.seconds_type[m] = type;
    return c->view[k].len / c->view[k].itemsize == c->read.given[m];
}

/* Stamped medium `m`'s stamps held, and where each grid's begin: 1; 0 for stamps that are not one
 * a frame of its grids; -1 with an exception set. Grids without frames leave `stamp_first` NULL
 * (items_media_fit refuses them). */
static int
hold_stamps(Reading *c, int m, PyObject *stamps)
{
    ItemRead *r = &c->read;
    const Py_ssize_t grids = r->given[m];
    if (stamps == Py_None)
        return 0;
    if (hold(c, R_MEDIA + MAX_LAYOUT_MEDIA + m, stamps, 4, "stamps") < 0)
        return -1;
    r->seconds[m] = c->view[R_MEDIA + MAX_LAYOUT_MEDIA + m].buf;
    int64_t frames = 0;
    for (Py_ssize_t i = 0; i < grids; i++) {
        const int64_t t = r->media[m][3 * i];
        if (t < 1)
            return 1;
        if (__builtin_add_overflow(frames, t, &frames))
            return 0;
    }
    if (frames != c->view[R_MEDIA + MAX_LAYOUT_MEDIA + m].len / 4)
        return 0;
    int64_t *first = r->stamp_first[m] = PyMem_RawMalloc((size_t)(grids + 1) * sizeof(int64_t));
    if (!first) {
        PyErr_NoMemory();
        return -1;
    }
    first[0] = 0;
    for (Py_ssize_t i = 0; i < grids; i++)
        first[i + 1] = first[i] + r->media[m][3 * i];
    return 1;
}

/* The call's ids, samples and media acquired and checked, then its items read: a status, or -1
 * with an exception set. */
static int
reading(Reading *c, const ItemLayout *l, PyObject *ids, Py_ssize_t batch, Py_ssize_t length, PyObject *mask,
        PyObject *first, PyObject *count, PyObject *media, PyObject *seconds, uint32_t enabled)
{
    ItemRead *r = &c->read;
    r->layout = l;
    r->enabled = enabled;
    if (hold(c, R_IDS, ids, 8, "ids") < 0 || (mask != Py_None && hold(c, R_MASK, mask, 1, "mask") < 0) ||
        (first != Py_None && hold(c, R_FIRST, first, 8, "first") < 0) ||
        (count != Py_None && hold(c, R_COUNT, count, 8, "count") < 0))
        return -1;
    if (!PyTuple_Check(media) || !PyTuple_Check(seconds) || PyTuple_GET_SIZE(media) != l->media_count ||
        PyTuple_GET_SIZE(seconds) != l->media_count) {
        PyErr_SetString(PyExc_ValueError, "items: one array (or None) of media and of seconds per medium");
        return -1;
    }
    const Py_ssize_t tokens = batch * length;
    int fits = batch >= 1 && length >= 1 && length <= INT32_MAX && c->view[R_IDS].len / 8 == tokens &&
               c->held[R_FIRST] == c->held[R_COUNT] && (!c->held[R_MASK] || c->view[R_MASK].len == tokens) &&
               (!c->held[R_FIRST] || c->view[R_FIRST].len == c->view[R_COUNT].len);
    for (int m = 0; fits && m < l->media_count; m++) {
        PyObject *values = PyTuple_GET_ITEM(media, m), *given_seconds = PyTuple_GET_ITEM(seconds, m);
        const Py_ssize_t itemsize = l->medium[m].type == MEDIA_GRID ? 24 : 8;
        if (values != Py_None) {
            if (hold(c, R_MEDIA + m, values, itemsize, "media") < 0)
                return -1;
            r->media[m] = c->view[R_MEDIA + m].buf;
            r->given[m] = c->view[R_MEDIA + m].len / itemsize;
        }
        if (l->medium[m].timed && r->given[m] && (fits = given_seconds != Py_None) &&
            (fits = hold_seconds(c, m, given_seconds)) < 0)
            return -1;
        if (l->medium[m].stamped && r->given[m] && (fits = hold_stamps(c, m, given_seconds)) < 0)
            return -1;
    }
    if (!fits) {
        PyErr_Format(PyExc_ValueError, "items: sizes do not fit a batch of %zd x %zd", batch, length);
        return -1;
    }
    r->ids = c->view[R_IDS].buf;
    r->samples = c->held[R_FIRST] ? c->view[R_FIRST].len / 8 : batch;
    if (!items_media_fit(r))
        return ITEMS_BAD_MEDIA;
    r->capacity = 64;
    r->first_item = PyMem_RawMalloc((size_t)(r->samples + 1) * sizeof(Py_ssize_t));
    r->items = PyMem_RawMalloc((size_t)r->capacity * sizeof(Item));
    if (!c->held[R_FIRST])
        c->spans = PyMem_RawMalloc((size_t)(2 * batch) * sizeof(int64_t));
    if (!r->first_item || !r->items || (!c->held[R_FIRST] && !c->spans)) {
        PyErr_NoMemory();
        return -1;
    }
    if (c->held[R_FIRST]) {
        r->first = c->view[R_FIRST].buf;
        r->count = c->view[R_COUNT].buf;
        for (Py_ssize_t s = 0; s < r->samples; s++)  /* back to back, each inside a row */
            if (r->count[s] < 0 || r->first[s] != (s ? r->first[s - 1] + r->count[s - 1] : 0) ||
                (r->count[s] && r->first[s] / length != (r->first[s] + r->count[s] - 1) / length)) {
                PyErr_Format(PyExc_ValueError, "items: sample %zd does not follow the one before in a row", s);
                return -1;
            }
        if (r->samples && r->first[r->samples - 1] + r->count[r->samples - 1] != tokens) {
            PyErr_SetString(PyExc_ValueError, "items: the samples do not cover the batch");
            return -1;
        }
    } else {
        c->one_per_row = 1;
        r->first = c->spans;
        r->count = c->spans + batch;
        if (c->held[R_MASK]) {
            int inside;
            Py_BEGIN_ALLOW_THREADS
            inside = mask_spans(c->view[R_MASK].buf, batch, length, c->spans, c->spans + batch);
            Py_END_ALLOW_THREADS
            if (inside)
                return ITEMS_PADDING_INSIDE;
        } else {
            for (Py_ssize_t b = 0; b < batch; b++)
                c->spans[b] = b * length, c->spans[batch + b] = length;
        }
    }
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = items_read(r);
    Py_END_ALLOW_THREADS
    if (status < 0)
        PyErr_NoMemory();
    return status;
}

/* ---- placing ----------------------------------------------------------------------------- */

typedef struct {
    const ItemLayout *layout;
    const ItemRead *read;
    Py_ssize_t batch, length;
    int text_row, one_per_row, form;
    char *out, *deltas;
    const uint8_t *generated;  /* (B, L): 1 where a rollout engine generated the token; or NULL */
} Placing;

/* `n` marker tokens at `at` from `*cursor`, counting on or sharing one position; opening
 * markers move the cursor past them in one sum, closing ones one past the last. */
static inline void
place_markers(int form, int share, int closing, char *const row[3], int64_t at, int64_t n, double *cursor,
              double *largest, Decoding *d)
{
    if (n <= 0)
        return;
    if (decoding_due(d, at + n))
        decoding_settle(d, form, at, n, *cursor, !share, *largest);
    if (share) {
        values_fill3(form, row, at, n, *cursor);
        *largest = values_max(*largest, *cursor);
        *cursor = values_add(form, *cursor, 1);
        return;
    }
    values_ramp3(form, row, at, n, 0, *cursor);
    const double last = values_add(form, (double)(n - 1), *cursor);
    *largest = values_max(*largest, last);
    *cursor = closing ? values_add(form, last, 1) : values_add(form, *cursor, (double)n);
}

/* `n` text tokens at `at` counting on from `*cursor` (those of runs of generated tokens where
 * they are decoded). */
static inline void
place_text(int form, char *const row[3], int64_t at, int64_t n, double *cursor, double *largest, Decoding *d)
{
    if (decoding_meets(d, at, at + n))
        decoding_ramp(d, form, row, at, n, *cursor, *largest);
    else
        values_ramp3(form, row, at, n, 0, *cursor);
    *largest = values_max(*largest, values_add(form, (double)(n - 1), *cursor));
    *cursor = values_add(form, *cursor, (double)n);
}

/* An item's media from `start`: `block` receives their largest position. Returns the largest
 * position of the part placed last. */
static double
place_media(const Placing *p, const Item *item, char *const row[3], int64_t at, double start, double *block)
{
    const ItemLayout *l = p->layout;
    const KindSpec *kind = &l->kind[item->kind];
    const int form = p->form, first = kind->medium[0];
    if (l->medium[first].type == MEDIA_SEQUENCE) {
        const int64_t tokens = item->media_tokens[0];
        values_ramp3(form, row, at, tokens, 0, start);
        return *block = values_add(form, (double)(tokens - 1), start);
    }
    const int64_t *grid = p->read->media[first] + 3 * item->media[0], merge = l->medium[first].merge;
    GridBlock g = {l->medium[first].per_frame ? 1 : grid[0], grid[1] / merge, grid[2] / merge, {0}, start, -1, NULL};
    items_scale(p->read, first, item->media[0], &g.scale, &g.stamps);  /* the reading checked it */
    *block = grid_largest(form, &g);
    if (kind->media_count == 1) {
        grid_range(form, row, at, &g, 0, g.frames * g.height * g.width);
        return *block;
    }
    const int64_t tokens = item->media_tokens[1];
    *block = values_max(*block, values_add(form, (double)(tokens - 1), start));
    return interleave(kind->interleave, kind->chunk, form, row, at, &g, tokens);
}

/* The largest line or column position of an item's grid placed from `start`. */
static double
spatial_largest(const Placing *p, const Item *item, double start)
{
    const int medium = p->layout->kind[item->kind].medium[0];
    const int64_t *grid = p->read->media[medium] + 3 * item->media[0], merge = p->layout->medium[medium].merge;
    const int64_t side = (grid[1] > grid[2] ? grid[1] : grid[2]) / merge;
    return values_add(p->form, (double)(side - 1), start);
}

/* An item's media block placed from `start` again, apart, in the layout's sums, into `*scratch`
 * (its three rows, `*form` the form they hold): where runs of generated tokens start inside it.
 * 0, or -1 without memory. */
static int
place_block_apart(const Placing *p, const Item *item, double start, char **scratch, char *row[3], int *form)
{
    Placing apart = *p;
    apart.form = *form = p->form == FORM_INT64 ? FORM_INT64 : FORM_FLOAT32;
    const size_t size = form_size(apart.form);
    const int64_t tokens = item->media_tokens[0] + item->media_tokens[1];
    *scratch = PyMem_RawMalloc((size_t)(3 * tokens) * size);
    if (!*scratch)
        return -1;
    for (int r = 0; r < 3; r++)
        row[r] = *scratch + (size_t)(r * tokens) * size;
    double block;
    place_media(&apart, item, row, 0, start, &block);
    return 0;
}

/* Settle the runs of generated tokens that start inside an item's media block (tokens [at, at +
 * tokens), placed from `start`, its largest `block`) or just after it: those inside from the
 * largest position before their first token, in one pass over the block placed apart for all of
 * them. 0, or -1 without memory. */
static int
settle_in_block(const Placing *p, const Item *item, Decoding *d, int64_t at, int64_t tokens, double start,
                double block, double largest)
{
    char *scratch = NULL, *row[3];
    int form = FORM_INT64;
    int64_t scanned = 0;  /* the block's tokens before it are in `largest` */
    while (decoding_due(d, at + tokens)) {
        const int64_t inside = d->run[d->settled].start - at;
        if (inside >= tokens) {
            decoding_settle_next(d, p->form, values_max(largest, block));
            continue;
        }
        if (scratch == NULL && place_block_apart(p, item, start, &scratch, row, &form) < 0)
            return -1;
        for (; scanned < inside; scanned++)
            for (int r = 0; r < 3; r++)
                largest = values_max(largest, form == FORM_FLOAT32 ? (double)((float *)row[r])[scanned]
                                                                    : (double)((int64_t *)row[r])[scanned]);
        decoding_settle_next(d, p->form, largest);
    }
    PyMem_RawFree(scratch);
    return 0;
}

/* Sample s's positions on its three rows into `*largest` (its largest position); `d`: its runs
 * of generated tokens, whose deltas are settled on the way (or NULL). 0, or -1 without memory. */
static int
place_sample(const Placing *p, Py_ssize_t s, char *const row[3], Decoding *d, double *largest)
{
    const ItemLayout *l = p->layout;
    const ItemRead *r = p->read;
    const int form = p->form;
    const int64_t count = r->count[s];
    double cursor = 0;
    *largest = -1;
    if (decoding_due(d, 0))  /* a run from the sample's first token: nothing before it */
        decoding_settle_next(d, form, -1);
    if (l->text_only) {
        if (decoding_meets(d, 0, count))
            decoding_ramp(d, form, row, 0, count, 0.0, -1);
        else
            values_ramp3(form, row, 0, count, 0, 0.0);
        *largest = count ? (double)(count - 1) : -1.0;
        return 0;
    }
    int64_t at = 0;
    for (Py_ssize_t i = r->first_item[s]; i < r->first_item[s + 1]; i++) {
        const Item *item = &r->items[i];
        const KindSpec *kind = &l->kind[item->kind];
        const int64_t text = item->start - at;
        /* int64 sums are exact: markers that count on continue the text's ramp in one write */
        const int64_t joined = form == FORM_INT64 && !kind->share_markers ? kind->lead : 0;
        if (text + joined) {
            place_text(form, row, at, text + joined, &cursor, largest, d);
            at += text + joined;
        }
        place_markers(form, kind->share_markers, 0, row, at, kind->lead - joined, &cursor, largest, d);
        at += kind->lead - joined;
        double block;
        const double last = place_media(p, item, row, at, cursor, &block);
        const int64_t tokens = item->media_tokens[0] + item->media_tokens[1];
        if (decoding_due(d, at + tokens) && settle_in_block(p, item, d, at, tokens, cursor, block, *largest) < 0)
            return -1;
        *largest = values_max(*largest, block);
        cursor = values_add(form, kind->resume == RESUME_LAST ? last : kind->resume == RESUME_SPATIAL ?
                                  spatial_largest(p, item, cursor) : block, 1);
        at += tokens;
        place_markers(form, kind->share_markers, 1, row, at, item->start + item->tokens - at, &cursor, largest, d);
        at = item->start + item->tokens;
    }
    if (at < count)
        place_text(form, row, at, count - at, &cursor, largest, d);
    return 0;
}

typedef struct {
    const Placing *p;
    Py_ssize_t first_sample, end_sample;
    int failed;  /* out of memory */
} PlaceWork;

static void *
place_samples(void *argument)
{
    PlaceWork *work = argument;
    const Placing *p = work->p;
    const ItemLayout *l = p->layout;
    const ItemRead *r = p->read;
    const int form = p->form;
    const size_t size = form_size(form);
    const Py_ssize_t length = p->length, rows = p->text_row ? 4 : 3;
    Decoding decoding = {0};
    for (Py_ssize_t s = work->first_sample; s < work->end_sample; s++) {
        const int64_t first = r->first[s], count = r->count[s];
        /* an empty sample ending the rows lies at the end of the last one */
        const int64_t b = first < p->batch * length ? first / length : p->batch - 1, column = first - b * length;
        char *row[4];
        for (Py_ssize_t k = 0; k < rows; k++)
            row[k] = p->out + (p->text_row ? (b * 4 + k) * length : (k * p->batch + b) * length) * size;
        char *const *positions = p->text_row ? row + 1 : row;
        char *at_sample[3];
        for (int k = 0; k < 3; k++)
            at_sample[k] = positions[k] + column * size;
        Decoding *d = NULL;
        if (p->generated) {
            const int found = decoding_find(&decoding, p->generated + first, count);
            work->failed = found < 0;
            d = found > 0 ? &decoding : NULL;
        }
        double largest;
        if (work->failed || place_sample(p, s, at_sample, d, &largest) < 0) {
            work->failed = 1;
            break;
        }
        if (p->text_row)
            values_ramp(form, row[0], column, count, 0, 0.0);
        if (p->one_per_row) {
            for (Py_ssize_t k = 0; k < rows; k++) {
                const double value = p->text_row && k == 0 ? 1 : l->padding;
                values_fill(form, row[k], 0, column, value);
                values_fill(form, row[k], column + count, length - column - count, value);
            }
            if (l->padding_in_largest && count < length)
                largest = values_max(largest, l->padding);
        }
        const double delta = values_add(form, values_add(form, largest, 1), (double)-count);
        int64_t decoded_delta;
        if (d && decoding_write(d, at_sample, count, &decoded_delta))  /* it ends in a decoded run */
            ((int64_t *)p->deltas)[s] = decoded_delta;
        else if (form == FORM_FLOAT32)
            ((float *)p->deltas)[s] = (float)delta;
        else
            ((int64_t *)p->deltas)[s] = (int64_t)delta;
    }
    decoding_free(&decoding);
    return NULL;
}

const char place_items_doc[] =
"place_items(layout, out, text_row, batch, length, ids, mask, first, count, media, seconds, deltas,\n"
"            enabled, threads, generated=None) -> status\n\n"
"Positions of a batch's media items by `layout` (compile_layout), written into `out` (float32 or\n"
"int64 by the layout's form; (3, B, L), or (B, 4, L) with `text_row`, whose row 0 counts each\n"
"sample's tokens from 0 and holds 1 at padding), and each sample's largest position + 1 - its\n"
"tokens into `deltas` (same dtype). `ids`: int64 (B, L). Samples: `first` (flat index) and\n"
"`count` (int64), covering the rows back to back; or, both None, one per row: its valid tokens\n"
"in `mask` (bool, or None: all). `media`: per medium, int64 (N, 3) grids or (N,) lengths, or\n"
"None; `seconds`: per timed medium, float32, float64 or int64 (N,) seconds per grid, per stamped\n"
"medium float32 time stamps, one a frame, grid after grid, else None. `enabled`: a bit\n"
"per kind that may occur. `generated`: None, or bool (B, L), 1 where a rollout engine generated\n"
"the token (int64 forms only): each run of them at its index in the sample plus the delta of\n"
"what precedes it; a sample ending in one has that delta. Returns 0 when written; 1 where\n"
"tokens and media disagree, 2 for padding inside a row, 3 for media that cannot be placed, 4 for\n"
"a sample without tokens.";

PyObject *
place_items(PyObject *module, PyObject *args)
{
    PyObject *capsule, *out_obj, *ids, *mask, *first, *count, *media, *seconds, *deltas_obj, *generated_obj = Py_None;
    int text_row, threads;
    Py_ssize_t batch, length;
    unsigned int enabled;
    if (!PyArg_ParseTuple(args, "OOpnnOOOOOOOIi|O:place_items", &capsule, &out_obj, &text_row, &batch, &length, &ids,
                          &mask, &first, &count, &media, &seconds, &deltas_obj, &enabled, &threads, &generated_obj))
        return NULL;
    const ItemLayout *l = layout_of(capsule);
    if (!l)
        return NULL;
    const Py_ssize_t value_size = (Py_ssize_t)form_size(l->form), rows = text_row ? 4 : 3;
    Py_buffer out, deltas, generated = {0};
    if (acquire(out_obj, &out, 1, value_size, "out") < 0)
        return NULL;
    if (acquire(deltas_obj, &deltas, 1, value_size, "deltas") < 0) {
        PyBuffer_Release(&out);
        return NULL;
    }
    Reading c = {0};
    PyObject *result = NULL;
    int status = -1;
    if (generated_obj != Py_None && acquire(generated_obj, &generated, 0, 1, "generated") < 0)
        goto release;
    status = reading(&c, l, ids, batch, length, mask, first, count, media, seconds, enabled);
    if (status < 0)
        goto release;
    if (out.len / value_size != rows * batch * length || deltas.len / value_size != c.read.samples ||
        (generated.buf && (generated.len != batch * length || l->form == FORM_FLOAT32))) {
        PyErr_Format(PyExc_ValueError, "place_items: out, deltas or generated do not fit a batch of %zd x %zd (or "
                     "generated with float32 positions)", batch, length);
        goto release;
    }
    if (status == ITEMS_PLACED) {
        const Placing p = {l, &c.read, batch, length, text_row, c.one_per_row, l->form, out.buf, deltas.buf,
                           generated.buf};
        const Py_ssize_t samples = c.read.samples, tokens = batch * length;
        const Py_ssize_t workers = worker_count(rows * tokens, samples, threads);
        PlaceWork work[MAX_THREADS];
        Py_ssize_t s = 0;
        for (Py_ssize_t w = 0; w < workers; w++) {  /* each worker the samples of about an equal share of tokens */
            const int64_t until = tokens * (w + 1) / workers;
            work[w] = (PlaceWork){&p, s, s, 0};
            while (work[w].end_sample < samples && (w == workers - 1 || c.read.first[work[w].end_sample] < until))
                work[w].end_sample++;
            s = work[w].end_sample;
        }
        Py_BEGIN_ALLOW_THREADS
        run_workers(place_samples, work, sizeof(PlaceWork), workers);
        Py_END_ALLOW_THREADS
        for (Py_ssize_t w = 0; w < workers; w++)
            if (work[w].failed) {
                PyErr_NoMemory();
                goto release;
            }
    }
    result = PyLong_FromLong(status);
release:
    reading_release(&c);
    if (generated.buf)
        PyBuffer_Release(&generated);
    PyBuffer_Release(&deltas);
    PyBuffer_Release(&out);
    return result;
}

const char find_items_doc[] =
"find_items(layout, batch, length, ids, mask, first, count, media, seconds, enabled)\n"
"    -> (status, sample, token, items)\n\n"
"The media items place_items would place, read as it reads them: `items` holds int64 records\n"
"(sample, start, tokens, kind, media index, second media index or -1) as bytes, one per item\n"
"found. Where the status is not 0, `sample` and `token` say where reading stopped (-1: before\n"
"any sample; the sample count: media left over).";

PyObject *
find_items(PyObject *module, PyObject *args)
{
    PyObject *capsule, *ids, *mask, *first, *count, *media, *seconds;
    Py_ssize_t batch, length;
    unsigned int enabled;
    if (!PyArg_ParseTuple(args, "OnnOOOOOOI:find_items", &capsule, &batch, &length, &ids, &mask, &first, &count,
                          &media, &seconds, &enabled))
        return NULL;
    const ItemLayout *l = layout_of(capsule);
    if (!l)
        return NULL;
    Reading c = {0};
    c.read.failed_sample = -1;
    PyObject *result = NULL;
    const int status = reading(&c, l, ids, batch, length, mask, first, count, media, seconds, enabled);
    if (status >= 0) {
        const Py_ssize_t found = status == ITEMS_PLACED ? c.read.first_item[c.read.samples] : 0;
        int64_t *records = PyMem_RawMalloc((size_t)(6 * found + 1) * sizeof(int64_t));
        if (!records) {
            PyErr_NoMemory();
        } else {
            for (Py_ssize_t s = 0, i = 0; i < found; i++) {
                while (c.read.first_item[s + 1] <= i)
                    s++;
                const Item *item = &c.read.items[i];
                const int64_t record[6] = {s, item->start, item->tokens, item->kind, item->media[0], item->media[1]};
                memcpy(records + 6 * i, record, sizeof(record));
            }
            result = Py_BuildValue("(innN)", status, c.read.failed_sample, (Py_ssize_t)c.read.failed_token,
                                   PyBytes_FromStringAndSize((const char *)records, 6 * found * (Py_ssize_t)sizeof(int64_t)));
            PyMem_RawFree(records);
        }
    }
    reading_release(&c);
    return result;
}
