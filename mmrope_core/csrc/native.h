/* mmrope_core._native: the loops over every token of a CPU batch, compiled.
 *
 * Family-neutral primitives, each in a file of its own:
 * - common.c: buffers, and threads started and joined within a call;
 * - masks.c: reading attention masks (0/1 checks, spans of valid tokens, coded types, changes);
 * - tokens.c: reading token ids (media types, counts);
 * - items.c: finding media items between marker tokens, checked against their media;
 * - media (native.h): the tokens a grid or a sequence of frames takes;
 * - temporal.c: temporal ids, scaled and truncated by a rule given as data;
 * - blocks.c: writing blocks of positions (ramps, fills, t/h/w grids) in int64 or float32;
 * - interleave.c: merging a grid's frames and a sequence's tokens by time;
 * - place.c: placing media items by a layout given as data (composing the above);
 * - decode.c: generated tokens placed where a rollout engine decodes them;
 * - module.c: the module's functions.
 * Buffers are acquired and checked with the GIL held; the loops run without it, on threads
 * started and joined within each call for large batches, so calls may overlap and a fork finds
 * no pool.
 */
#ifndef MMROPE_NATIVE_H
#define MMROPE_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Functions shared between these files are the extension's own: calls stay direct and may be
 * inlined (the module's init function is exported by PyMODINIT_FUNC). */
#if defined(__GNUC__)
#pragma GCC visibility push(hidden)
#endif

#define MAX_THREADS 64
/* Below this many positions written (or tokens read) per thread, another thread costs more
 * than it saves: starting and joining one takes some 20 microseconds, the work itself well
 * under a nanosecond per item. */
#define ITEMS_PER_THREAD (1 << 17)
#define MAX_MEDIA_TOKENS 16

/* The loops over tokens compare 64-bit ids and mask values and write 64-bit positions, which
 * x86-64's baseline vector instructions do two at a time at best: where the loader can pick a
 * function at run time (GNU ifunc), those loops are also built for AVX2 and used on CPUs that
 * have it. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* ---- common.c ---------------------------------------------------------------------------- */

/* Rows [first_row, end_row) of a batch, one range per worker. */
typedef struct {
    Py_ssize_t first_row, end_row;
} RowRange;

void run_workers(void *(*task)(void *), void *items, size_t size, Py_ssize_t workers);
Py_ssize_t worker_count(Py_ssize_t items, Py_ssize_t parts, int threads);
Py_ssize_t split_rows(RowRange *ranges, Py_ssize_t batch, Py_ssize_t length, int threads);
int acquire(PyObject *object, Py_buffer *view, int writable, Py_ssize_t itemsize, const char *name);
int acquire_reading(const char *name, PyObject *input_obj, Py_ssize_t itemsize, PyObject *output_obj,
                    Py_ssize_t batch, Py_ssize_t length, Py_buffer *input, Py_buffer *output);

/* Python's floor division. */
static inline int64_t
floor_div(int64_t a, int64_t b)
{
    const int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* ---- masks.c ----------------------------------------------------------------------------- */

int mask_spans(const uint8_t *mask, Py_ssize_t batch, Py_ssize_t length, int64_t *first, int64_t *count);
PyObject *read_mask(PyObject *module, PyObject *args);
PyObject *coded(PyObject *module, PyObject *args);
PyObject *changes(PyObject *module, PyObject *values);
extern const char read_mask_doc[], coded_doc[], changes_doc[];

/* ---- tokens.c ---------------------------------------------------------------------------- */

void type_rows_64(const int64_t *ids, int8_t *types, Py_ssize_t first, Py_ssize_t end, const int64_t *token,
                  const int8_t *type, Py_ssize_t count);
void type_rows_32(const int32_t *ids, int8_t *types, Py_ssize_t first, Py_ssize_t end, const int64_t *token,
                  const int8_t *type, Py_ssize_t count);
int64_t count_token(const int64_t *ids, int64_t count, int64_t token);
PyObject *token_types(PyObject *module, PyObject *args);
extern const char token_types_doc[];

/* ---- temporal.c -------------------------------------------------------------------------- */

/* PRECISION_SECONDS: the arithmetic numpy multiplies the seconds in, by their dtype (see
 * temporal_rule_for). */
enum { PRECISION_FLOAT32, PRECISION_FLOAT64, PRECISION_INT64, PRECISION_SECONDS };
/* The dtypes seconds per grid come in. */
enum { SECONDS_FLOAT32, SECONDS_FLOAT64, SECONDS_INT64 };

/* How a frame's temporal id comes from its index, the seconds per grid and the positions per
 * second: (frame * seconds) * per_second or frame * (seconds * per_second), in float32, float64
 * or int64 arithmetic (int64: seconds truncated to whole seconds, per_second whole), and
 * truncated toward zero or not. `per_second_whole`: per_second was given as a whole number. */
typedef struct {
    double per_second;
    int frame_first, precision, truncate, whole_seconds, per_second_whole;
} TemporalRule;

/* A rule applied to one grid's seconds. */
typedef struct {
    int frame_first, precision, truncate;
    float seconds32, per_second32, scale32;
    double seconds64, per_second64, scale64;
    int64_t scale_int;
} TemporalScale;

TemporalRule temporal_rule_for(const TemporalRule *rule, int seconds_type);
int temporal_scale(const TemporalRule *rule, double seconds, TemporalScale *scale);
int temporal_truncated(const TemporalScale *scale, int64_t frame, int64_t *id);

/* The product before truncation, in the rule's arithmetic (inline: placing takes it per frame). */
static inline double
temporal_product(const TemporalScale *s, int64_t frame)
{
    switch (s->precision) {
    case PRECISION_INT64:
        return (double)(frame * s->scale_int);
    case PRECISION_FLOAT32:
        return s->frame_first ? (double)(((float)frame * s->seconds32) * s->per_second32)
                              : (double)((float)frame * s->scale32);
    default:
        return s->frame_first ? ((double)frame * s->seconds64) * s->per_second64 : (double)frame * s->scale64;
    }
}

/* Frame `frame`'s temporal id as positions take it: truncated toward zero under a truncating
 * rule (values beyond int64 are left as they are: reading refuses them). */
static inline double
temporal_position(const TemporalScale *s, int64_t frame)
{
    const double value = temporal_product(s, frame);
    if (!s->truncate || s->precision == PRECISION_INT64 || !(value > -9.2e18 && value < 9.2e18))
        return value;
    return (double)(int64_t)value;
}

/* A stamped frame's temporal id: the rule applied to its time stamp as to `frame * seconds`
 * (float32 or float64 rules), truncated as temporal_position truncates. */
static inline double
temporal_stamped(const TemporalScale *s, float stamp)
{
    const double value = s->precision == PRECISION_FLOAT32 ? (double)(stamp * s->per_second32)
                                                           : (double)stamp * s->per_second64;
    if (!s->truncate || !(value > -9.2e18 && value < 9.2e18))
        return value;
    return (double)(int64_t)value;
}

/* ---- media: the tokens a grid or a sequence of frames takes --------------------------------- */

#define MAX_STEPS 4

/* Tokens of a sequence of `length` frames (an audio's): the frames left after whole windows of
 * `window` frames (each giving `per_window` tokens) pass strided layers, each taking n frames to
 * (n - drop) // stride + 1; no layer and no window: the length is the tokens. */
typedef struct {
    int steps;
    int64_t drop[MAX_STEPS], stride[MAX_STEPS];
    int shift[MAX_STEPS];  /* log2 of a stride that is a power of two (a shift floors as // does), else -1 */
    int64_t window, per_window;
} SequenceRule;

/* t * (h / merge) * (w / merge); -1 where it overflows int64 (no row holds that many tokens). */
static inline int64_t
grid_tokens(const int64_t *grid, int64_t merge)
{
    int64_t area, tokens;
    if (__builtin_mul_overflow(grid[1] / merge, grid[2] / merge, &area) || __builtin_mul_overflow(grid[0], area, &tokens))
        return -1;
    return tokens;
}

/* The tokens of `length` frames under `rule` (Python's floor division); -1 beyond any row. */
static inline int64_t
sequence_tokens(const SequenceRule *rule, int64_t length)
{
    if (length > ((int64_t)1 << 56))  /* beyond any row; the sums below stay in range */
        return -1;
    int64_t whole = 0, rest = length;
    if (rule->window > 0) {
        whole = floor_div(length, rule->window);
        rest = length - whole * rule->window;
    }
    for (int k = 0; k < rule->steps; k++)
        rest = (rule->shift[k] >= 0 ? (rest - rule->drop[k]) >> rule->shift[k]
                                    : floor_div(rest - rule->drop[k], rule->stride[k])) + 1;
    return rest + whole * rule->per_window;
}

/* ---- blocks.c ---------------------------------------------------------------------------- */

/* How positions are summed and written: int64 sums written as int64; float32 sums (rounded as
 * the reference rounds them) written as float32, or as int64 truncated toward zero (what
 * `.to(torch.int64)` makes of them). Values are kept as doubles, which hold every float32 and
 * every int64 position of a batch exactly. */
enum { FORM_INT64, FORM_FLOAT32, FORM_TRUNCATED };

/* The bytes of one written position. */
static inline size_t
form_size(int form)
{
    return form == FORM_FLOAT32 ? 4 : 8;
}

void fill(int64_t *out, Py_ssize_t count, int64_t value);
void ramp(int64_t *out, Py_ssize_t count, int64_t value);
void fill_f32(float *out, Py_ssize_t count, float value);
void ramp_f32(float *out, int32_t count, int32_t first, float start);
void ramp_truncated(int64_t *out, int32_t count, int32_t first, float start);

static inline double
values_add(int form, double a, double b)
{
    return form != FORM_INT64 ? (double)((float)a + (float)b) : a + b;
}

static inline double
values_max(double a, double b)
{
    return a > b ? a : b;
}

/* `count` values from token `at` on (inline: placing calls them per run of a few tokens). */
static inline void
values_fill(int form, char *row, int64_t at, int64_t count, double value)
{
    if (form == FORM_FLOAT32)
        fill_f32((float *)row + at, count, (float)value);
    else
        fill((int64_t *)row + at, count, (int64_t)value);  /* (a float32 value truncated toward zero) */
}

/* (first + i) + start, i = 0 .. count - 1 */
static inline void
values_ramp(int form, char *row, int64_t at, int64_t count, int64_t first, double start)
{
    if (form == FORM_FLOAT32)
        ramp_f32((float *)row + at, (int32_t)count, (int32_t)first, (float)start);
    else if (form == FORM_TRUNCATED)
        ramp_truncated((int64_t *)row + at, (int32_t)count, (int32_t)first, (float)start);
    else
        ramp((int64_t *)row + at, count, first + (int64_t)start);
}

/* The same on the three (t, h, w) rows. */
static inline void
values_ramp3(int form, char *const row[3], int64_t at, int64_t count, int64_t first, double start)
{
    for (int r = 0; r < 3; r++)
        values_ramp(form, row[r], at, count, first, start);
}

static inline void
values_fill3(int form, char *const row[3], int64_t at, int64_t count, double value)
{
    for (int r = 0; r < 3; r++)
        values_fill(form, row[r], at, count, value);
}

/* A grid of merged patches placed from `start`: its frames' temporal ids by `scale`. */
typedef struct {
    int64_t frames, height, width;
    TemporalScale scale;
    double start;
    int64_t pattern;  /* where its first frame's height and width rows were written, or -1 */
    const float *stamps;  /* a stamped grid's time stamps, one a frame; NULL: frames scaled by `scale` */
} GridBlock;

/* Frame `frame`'s temporal id, counted from the grid's start. */
static inline double
grid_temporal(const GridBlock *g, int64_t frame)
{
    /* unstamped grids are the common case: their path stays the straight one */
    return __builtin_expect(g->stamps != NULL, 0) ? temporal_stamped(&g->scale, g->stamps[frame])
                                                  : temporal_position(&g->scale, frame);
}

/* Its largest position on any axis (it includes its last token). */
static inline double
grid_largest(int form, const GridBlock *g)
{
    const double last_line = (double)(g->height - 1), last_column = (double)(g->width - 1);
    return values_add(form, values_max(grid_temporal(g, g->frames - 1), values_max(last_line, last_column)),
                      g->start);
}

void grid_frame(int form, char *const row[3], int64_t at, GridBlock *g, int64_t frame);
void grid_range(int form, char *const row[3], int64_t at, GridBlock *g, int64_t from, int64_t to);

/* ---- interleave.c ------------------------------------------------------------------------ */

enum { INTERLEAVE_NONE, INTERLEAVE_TIME, INTERLEAVE_CHUNKS, INTERLEAVE_GROUPS };

double interleave(int rule, int64_t chunk, int form, char *const row[3], int64_t at, GridBlock *g,
                  int64_t sequence_tokens);

/* ---- items.c, place.c: media items between markers, placed by a layout given as data ---- */

#define MAX_LAYOUT_MEDIA 8
#define MAX_KINDS 16
#define MAX_KEY 4
#define MAX_CLOSING 4
#define SPECIAL_BITS 4096

enum { MEDIA_GRID, MEDIA_SEQUENCE };
/* What reading and placing return: placed, or why not. */
enum { ITEMS_PLACED, ITEMS_MISMATCH, ITEMS_PADDING_INSIDE, ITEMS_BAD_MEDIA, ITEMS_EMPTY_SAMPLE };

/* One medium, whose items come in the batch's order: grids of (t, h, w) patches merged `merge`
 * a side (timed: seconds per grid given, else 1 each), or sequences of frames. */
typedef struct {
    int type;
    int64_t merge;
    int timed;
    int stamped;  /* a time stamp per frame given (in `seconds`, grid after grid) */
    int per_frame;  /* each item takes the next frame, placed as a (1, h, w) grid */
    int unscaled;  /* each frame at its index, whatever the layout's rule */
    SequenceRule rule;
} MediumSpec;

enum { RESUME_LARGEST, RESUME_LAST, RESUME_SPATIAL };

/* One kind of item: its `key` tokens open it (the first `opening` are markers; with `has_inside`,
 * only where more inside[0] than inside[1] markers precede it in its sample), then its media's
 * placeholders (two media: a grid's and a sequence's, interleaved by `interleave`; with
 * `whole_run`, not followed by one of them), then its closing markers. Placed: `lead` tokens
 * count on (or share one position) before its media block, the rest after it, from one past
 * the block's largest position (RESUME_*: or that of the part placed last, or the grid's
 * largest line or column position). */
typedef struct {
    int64_t key[MAX_KEY];
    int key_length, opening;
    int media_count;
    int medium[2];
    int64_t placeholder[2];
    int64_t closing[MAX_CLOSING];
    int closing_length;
    int has_inside;
    int64_t inside[2];  /* its begin and end markers, text */
    int has_first;
    int64_t first;  /* the token its media must begin with */
    int share_markers, lead, interleave, resume, whole_run;
    int64_t chunk;
    uint32_t exclusive;  /* kinds that may not share a sample with it */
} KindSpec;

typedef struct {
    MediumSpec medium[MAX_LAYOUT_MEDIA];
    int media_count;
    KindSpec kind[MAX_KINDS];
    int kind_count;
    TemporalRule temporal;
    int form;  /* how positions are summed and written (FORM_*) */
    double padding;  /* what padding holds */
    int padding_in_largest, text_only, refuse_empty;
    int has_inside;  /* a kind opens only inside markers, which reading counts */
    int64_t special_low;  /* tokens that may open an item, placeholders and inside markers lie in [low, low + span] */
    uint64_t special_span;
    /* which of them do, a bit each, where the span is below SPECIAL_BITS: one test a token */
    uint64_t special[SPECIAL_BITS / 64];
} ItemLayout;

typedef struct {
    int64_t start, tokens;  /* its first token among its sample's, and all its tokens */
    int64_t media[2], media_tokens[2];  /* each medium's item (in that medium's order; per frame: the grid
                                         * of its frame) and its tokens */
    int kind;
} Item;

typedef struct {
    const ItemLayout *layout;
    const int64_t *ids;
    const int64_t *first, *count;  /* samples: flat index of the first token, number of tokens */
    Py_ssize_t samples;
    uint32_t enabled;  /* kinds that may occur; another kind's key is a mismatch */
    const int64_t *media[MAX_LAYOUT_MEDIA];  /* grids (N, 3) or lengths (N,) */
    Py_ssize_t given[MAX_LAYOUT_MEDIA];
    const void *seconds[MAX_LAYOUT_MEDIA];  /* timed grids' seconds (SECONDS_*), stamped grids' float32 stamps */
    int seconds_type[MAX_LAYOUT_MEDIA];
    int64_t *stamp_first[MAX_LAYOUT_MEDIA];  /* stamped grids: where each grid's stamps begin */
    Item *items;
    Py_ssize_t capacity;
    Py_ssize_t *first_item;  /* the items of sample s: first_item[s] to first_item[s + 1] */
    Py_ssize_t failed_sample;  /* where reading stopped, or -1 */
    int64_t failed_token;
} ItemRead;

ItemLayout *layout_of(PyObject *capsule);
int items_media(ItemRead *read, PyObject *media, PyObject *seconds);
int items_media_fit(const ItemRead *read);
int items_read(ItemRead *read);
int items_scale(const ItemRead *read, int medium, int64_t index, TemporalScale *scale, const float **stamps);

/* ---- decode.c: generated tokens where a rollout engine decodes them ------------------------ */

/* A sample's runs of generated tokens, by their first token and one past their last, and the
 * delta each is decoded with: its tokens sit at their index in the sample plus the delta, on
 * every row. The delta is the largest position before the run + 1 - the run's first index,
 * summed as the positions are, truncated toward zero; placing settles it where it passes the
 * token before the run, and writes the run where it places text (elsewhere, over what it
 * placed: decoding_write). */
typedef struct {
    int64_t start, end, delta;
    int64_t written;  /* its tokens from `start` to here are written where they are decoded */
} DecodedRun;

typedef struct {
    DecodedRun *run;
    Py_ssize_t runs, capacity;
    Py_ssize_t settled;  /* the runs before it have their delta */
    Py_ssize_t current;  /* the runs before it end before the text being placed */
} Decoding;

int decoding_find(Decoding *d, const uint8_t *generated, int64_t count);
void decoding_settle_next(Decoding *d, int form, double before);
void decoding_settle(Decoding *d, int form, int64_t at, int64_t n, double first, int counts_on, double largest);
void decoding_ramp(Decoding *d, int form, char *const row[3], int64_t at, int64_t n, double first, double largest);
int decoding_write(const Decoding *d, char *const row[3], int64_t count, int64_t *last_delta);
void decoding_free(Decoding *d);

/* Whether a run not yet settled starts at or before token `end` (its token before lies before `end`). */
static inline int
decoding_due(const Decoding *d, int64_t end)
{
    return d != NULL && d->settled < d->runs && d->run[d->settled].start <= end;
}

/* Whether text tokens [at, end) meet a run, or settle the one starting at `end`. */
static inline int
decoding_meets(Decoding *d, int64_t at, int64_t end)
{
    if (d == NULL)
        return 0;
    while (d->current < d->runs && d->run[d->current].end <= at)
        d->current++;
    return d->current < d->runs && d->run[d->current].start <= end;
}

/* ---- module functions ------------------------------------------------------------------- */

PyObject *compile_layout(PyObject *module, PyObject *args);
PyObject *place_items(PyObject *module, PyObject *args);
PyObject *find_items(PyObject *module, PyObject *args);
extern const char compile_layout_doc[], place_items_doc[], find_items_doc[];

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif
