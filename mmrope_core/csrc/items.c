/* Finding media items between marker tokens: each sample's items in order, each checked
 * against the media it takes (grids, sequence lengths), which the batch gives in order. */
#include "native.h"

#include <math.h>

/* mmrope_core.media.MAX_SECONDS_PER_GRID: temporal ids of any grid a row holds fit int64. */
#define MAX_SECONDS 1048576.0

/* Time stamps of `grids` stamped grids, grid i's from first[i] to first[i + 1]: each finite,
 * from 0 to MAX_SECONDS, none below the one before in its grid. */
static int
stamps_fit(const float *stamps, const int64_t *first, Py_ssize_t grids)
{
    if (first == NULL)  /* grids without frames: refused as grids */
        return 0;
    for (Py_ssize_t i = 0; i < grids; i++)
        for (int64_t f = first[i]; f < first[i + 1]; f++)
            if (!(stamps[f] >= 0 && stamps[f] <= MAX_SECONDS) || (f > first[i] && stamps[f] < stamps[f - 1]))
                return 0;
    return 1;
}

/* Grid `index`'s seconds of timed medium `m`, read in their dtype. */
static inline double
seconds_of(const ItemRead *r, int m, Py_ssize_t index)
{
    switch (r->seconds_type[m]) {
    case SECONDS_FLOAT64:
        return ((const double *)r->seconds[m])[index];
    case SECONDS_INT64:
        return (double)((const int64_t *)r->seconds[m])[index];
    default:
        return ((const float *)r->seconds[m])[index];
    }
}

/* Grids, seconds, stamps and sequence lengths the positions can be computed from. */
int
items_media_fit(const ItemRead *r)
{
    const ItemLayout *l = r->layout;
    for (int m = 0; m < l->media_count; m++) {
        const MediumSpec *medium = &l->medium[m];
        const int64_t *values = r->media[m];
        for (Py_ssize_t i = 0; i < r->given[m]; i++) {
            if (medium->type == MEDIA_SEQUENCE) {
                if (values[i] < 0)
                    return 0;
                continue;
            }
            const int64_t *grid = values + 3 * i;
            if (grid[0] < 1 || grid[1] < 1 || grid[2] < 1 || grid[1] % medium->merge || grid[2] % medium->merge)
                return 0;
            if (medium->timed) {
                const double seconds = seconds_of(r, m, i);
                if (!(seconds >= 0 && seconds <= MAX_SECONDS))
                    return 0;
            }
        }
        if (medium->stamped && r->given[m] && !stamps_fit(r->seconds[m], r->stamp_first[m], r->given[m]))
            return 0;
    }
    return 1;
}

/* Grid `index` of `medium`'s temporal scale, and its stamps (`*stamps`, NULL for a grid not
 * stamped). An untimed grid counts one whole second (as int64 seconds, for the seconds' precision). */
int
items_scale(const ItemRead *r, int medium, int64_t index, TemporalScale *scale, const float **stamps)
{
    const MediumSpec *spec = &r->layout->medium[medium];
    *stamps = spec->stamped ? (const float *)r->seconds[medium] + r->stamp_first[medium][index] : NULL;
    const double seconds = spec->timed ? seconds_of(r, medium, index) : 1.0;
    static const TemporalRule frame_index = {1.0, 0, PRECISION_INT64, 1, 0, 1};
    const TemporalRule rule = spec->unscaled ? frame_index
                                             : temporal_rule_for(&r->layout->temporal,
                                                                 spec->timed ? r->seconds_type[medium] : SECONDS_INT64);
    return temporal_scale(&rule, seconds, scale);
}

/* The placeholder tokens of item `index` of medium `m` (per frame: of a frame of grid `index`); -1
 * where it takes none that fit a row. */
static int64_t
media_tokens(const ItemRead *r, int m, int64_t index)
{
    const MediumSpec *medium = &r->layout->medium[m];
    if (medium->type == MEDIA_SEQUENCE)
        return sequence_tokens(&medium->rule, r->media[m][index]);
    const int64_t *grid = r->media[m] + 3 * index, frame[3] = {1, grid[1], grid[2]};
    return grid_tokens(medium->per_frame ? frame : grid, medium->merge);
}

/* Whether a grid's temporal ids, from frame 0 to its last, lie within int64 positions. */
static int
temporal_fits(const ItemRead *r, int m, int64_t index)
{
    const int64_t frames = r->media[m][3 * index];
    const MediumSpec *spec = &r->layout->medium[m];
    const double seconds = spec->timed ? seconds_of(r, m, index) : 1.0;
    const float *all_stamps = r->seconds[m];
    const double span = spec->stamped ? (double)all_stamps[r->stamp_first[m][index] + frames - 1]  /* the last */
                                      : (double)frames * seconds;
    if (span * r->layout->temporal.per_second < 1e18)  /* far within */
        return 1;
    TemporalScale scale;
    const float *stamps;
    if (items_scale(r, m, index, &scale, &stamps) < 0)
        return 0;
    if (scale.precision == PRECISION_INT64)  /* before the int64 product, which may wrap: both factors exact */
        return (double)(frames - 1) * (double)scale.scale_int < 4611686018427387904.0;
    const double last = stamps ? temporal_stamped(&scale, stamps[frames - 1]) : temporal_position(&scale, frames - 1);
    return isfinite(last) && fabs(last) < 4611686018427387904.0;
}

/* Whether `id` may open an item, be a placeholder or an inside marker. */
static inline int
special(const ItemLayout *l, int64_t id)
{
    const uint64_t offset = (uint64_t)id - (uint64_t)l->special_low;
    if (offset > l->special_span)
        return 0;
    return l->special_span >= SPECIAL_BITS || (l->special[offset >> 6] >> (offset & 63) & 1);
}

/* The kind whose key opens at `ids` (`left` tokens on), or -1; a kind inside markers opens only
 * where `open[k]` of its begin markers are left open. */
static int
kind_at(const ItemLayout *l, const int64_t *ids, int64_t left, const int64_t *open)
{
    for (int k = 0; k < l->kind_count; k++) {
        const KindSpec *kind = &l->kind[k];
        if (kind->key_length > left || ids[0] != kind->key[0] || (kind->has_inside && open[k] <= 0))
            continue;
        int same = 1;
        for (int j = 1; j < kind->key_length && same; j++)
            same = ids[j] == kind->key[j];
        if (same)
            return k;
    }
    return -1;
}

static int
is_placeholder(const ItemLayout *l, int64_t id)
{
    for (int k = 0; k < l->kind_count; k++)
        for (int m = 0; m < l->kind[k].media_count; m++)
            if (l->kind[k].placeholder[m] == id)
                return 1;
    return 0;
}

/* Text token `id` opens or closes the markers of kinds inside them. */
static void
count_markers(const ItemLayout *l, int64_t id, int64_t *open)
{
    for (int k = 0; k < l->kind_count; k++)
        if (l->kind[k].has_inside)
            open[k] += (id == l->kind[k].inside[0]) - (id == l->kind[k].inside[1]);
}

static int
failed(ItemRead *r, Py_ssize_t sample, int64_t token, int status)
{
    r->failed_sample = sample;
    r->failed_token = token;
    return status;
}

/* Item `item` of kind `kind` at `ids[0]` (`left` tokens on): its media taken and checked (`used`:
 * each medium's items taken; `frame`: a per-frame medium's frames taken of its current grid).
 * Kept out of items_read, whose loop over tokens then keeps its values in registers. */
__attribute__((noinline)) static int
read_item(ItemRead *r, const KindSpec *kind, const int64_t *ids, int64_t left, Py_ssize_t *used, int64_t *frame,
          Item *item)
{
    int64_t content = 0;
    for (int m = 0; m < kind->media_count; m++) {
        const int medium = kind->medium[m];
        const int per_frame = r->layout->medium[medium].per_frame;
        if (used[medium] >= r->given[medium])
            return ITEMS_MISMATCH;
        item->media[m] = used[medium];
        if (!per_frame || ++frame[medium] == r->media[medium][3 * used[medium]])
            used[medium]++, frame[medium] = 0;
        const int64_t tokens = media_tokens(r, medium, item->media[m]);
        if (tokens < 1 || tokens > left)
            return ITEMS_MISMATCH;
        if (r->layout->medium[medium].type == MEDIA_GRID && !per_frame && !temporal_fits(r, medium, item->media[m]))
            return ITEMS_BAD_MEDIA;
        item->media_tokens[m] = tokens;
        content += tokens;
    }
    item->tokens = kind->opening + content + kind->closing_length;
    if (item->tokens > left)
        return ITEMS_MISMATCH;
    const int64_t *body = ids + kind->opening;
    for (int m = 0; m < kind->media_count; m++)
        if (count_token(body, content, kind->placeholder[m]) != item->media_tokens[m])
            return ITEMS_MISMATCH;
    if (kind->has_first && body[0] != kind->first)
        return ITEMS_MISMATCH;
    if (kind->whole_run && kind->opening + content < left)  /* its run goes on past its media */
        for (int m = 0; m < kind->media_count; m++)
            if (body[content] == kind->placeholder[m])
                return ITEMS_MISMATCH;
    for (int c = 0; c < kind->closing_length; c++)
        if (body[content + c] != kind->closing[c])
            return ITEMS_MISMATCH;
    return ITEMS_PLACED;
}

/* The first token from `i` on that may be special (text lies outside [low, low + span]). Not
 * inlined: in a frame of its own the loop keeps its values in registers, some 20 % faster. */
__attribute__((noinline)) static int64_t
text_until(const int64_t *restrict ids, int64_t i, int64_t n, uint64_t low, uint64_t span)
{
    while (i < n && (uint64_t)ids[i] - low > span)
        i++;
    return i;
}

/* Each sample's items in order: ITEMS_MISMATCH where markers, placeholders and media disagree
 * (a placeholder outside any item, a kind not enabled, media left over); -1 without memory. A
 * marker that opens no item (sampled in a response) is text, as the model reads it. */
int
items_read(ItemRead *r)
{
    const ItemLayout *l = r->layout;
    Py_ssize_t found = 0, used[MAX_LAYOUT_MEDIA] = {0};
    int64_t frame[MAX_LAYOUT_MEDIA] = {0};
    const uint64_t low = (uint64_t)l->special_low, span = l->special_span;
    r->failed_sample = -1;
    for (Py_ssize_t s = 0; s < r->samples; s++) {
        r->first_item[s] = found;
        const int64_t *ids = r->ids + r->first[s], n = r->count[s];
        uint32_t seen = 0;
        int64_t open[MAX_KINDS] = {0};  /* per kind inside markers: its begin markers less its end markers */
        if (n == 0 && l->refuse_empty)
            return failed(r, s, 0, ITEMS_EMPTY_SAMPLE);
        for (int64_t i = 0; i < n;) {
            i = text_until(ids, i, n, low, span);
            if (i == n)
                break;
            const int64_t id = ids[i];
            if (!special(l, id)) {
                i++;
                continue;
            }
            const int k = kind_at(l, ids + i, n - i, open);
            if (k < 0) {
                if (is_placeholder(l, id))
                    return failed(r, s, i, ITEMS_MISMATCH);  /* a placeholder outside any item */
                if (l->has_inside)
                    count_markers(l, id, open);
                i++;  /* text, or a marker opening nothing */
                continue;
            }
            const KindSpec *kind = &l->kind[k];
            if (!(r->enabled >> k & 1u) || (seen & kind->exclusive))
                return failed(r, s, i, ITEMS_MISMATCH);
            Item item = {i, 0, {-1, -1}, {0, 0}, k};
            const int status = read_item(r, kind, ids + i, n - i, used, frame, &item);
            if (status != ITEMS_PLACED)
                return failed(r, s, i, status);
            if (found == r->capacity) {
                const Py_ssize_t grown = 2 * r->capacity;
                Item *moved = PyMem_RawRealloc(r->items, (size_t)grown * sizeof(Item));
                if (!moved)
                    return -1;
                r->items = moved;
                r->capacity = grown;
            }
            r->items[found++] = item;
            seen |= 1u << k;
            i += item.tokens;
        }
    }
    r->first_item[r->samples] = found;
    for (int m = 0; m < l->media_count; m++)
        if (used[m] != r->given[m])
            return failed(r, r->samples, 0, ITEMS_MISMATCH);  /* media (or frames of a grid) left over */
    return ITEMS_PLACED;
}
