/* Generated tokens where a rollout engine decodes them: each run of them at its index in the
 * sample plus the delta of what precedes it (the prompt of the request that generated it), on
 * every row, where a prefill of the whole sequence may place them elsewhere (fractional
 * positions truncated). Placing finds a sample's runs, settles each run's delta as it passes the
 * token before the run, writes runs where it places text and, last, the rest of them. */
#include "native.h"

#include <string.h>

#define ALL_SET 0x0101010101010101ULL

/* Append run [start, end): 0, or -1 without memory. */
static int
append_run(Decoding *d, int64_t start, int64_t end)
{
    if (d->runs == d->capacity) {
        const Py_ssize_t grown = d->capacity ? 2 * d->capacity : 64;
        DecodedRun *moved = PyMem_RawRealloc(d->run, (size_t)grown * sizeof(DecodedRun));
        if (!moved)
            return -1;
        d->run = moved;
        d->capacity = grown;
    }
    d->run[d->runs++] = (DecodedRun){start, end, 0, start};
    return 0;
}

/* The runs of `generated` (a sample's flags, a byte each: 1 where generated, else 0): whether
 * there are any, or -1 without memory.
 * A run opens at the next 1 (memchr: many flags a step) and closes at the next 0, eight flags at
 * a time through the run. */
int
decoding_find(Decoding *d, const uint8_t *generated, int64_t count)
{
    d->runs = d->settled = d->current = 0;
    const uint8_t *found;
    for (int64_t i = 0; i < count && (found = memchr(generated + i, 1, (size_t)(count - i)));) {
        const int64_t start = found - generated;
        int64_t end = start + 1;
        for (uint64_t word; end + 8 <= count; end += 8) {
            memcpy(&word, generated + end, 8);
            if (word != ALL_SET)
                break;
        }
        while (end < count && generated[end])
            end++;
        if (append_run(d, start, end) < 0)
            return -1;
        i = end;
    }
    return (int)(d->runs > 0);
}

/* The next run's delta, from the largest position before it. */
void
decoding_settle_next(Decoding *d, int form, double before)
{
    DecodedRun *run = &d->run[d->settled++];
    run->delta = (int64_t)values_add(form, values_add(form, before, 1), -(double)run->start);
}

/* Settle the runs whose token before lies in tokens [at, at + n), placed from `first` on (one
 * position a token where they count on, else all at `first`), `largest` the largest position
 * before them. */
void
decoding_settle(Decoding *d, int form, int64_t at, int64_t n, double first, int counts_on, double largest)
{
    while (decoding_due(d, at + n)) {
        const int64_t before = d->run[d->settled].start - 1 - at;
        decoding_settle_next(d, form, values_max(largest, counts_on ? values_add(form, (double)before, first) : first));
    }
}

/* Tokens [at, at + count) of a run on the three int64 rows at i + delta: inline where there
 * are few (most runs among text are short, and a call costs more). */
static inline void
decoded_piece(char *const row[3], int64_t at, int64_t count, int64_t delta)
{
    for (int r = 0; r < 3; r++) {
        int64_t *out = (int64_t *)row[r];
        if (count >= 16)
            ramp(out + at, count, at + delta);
        else
            for (int64_t i = at; i < at + count; i++)
                out[i] = i + delta;
    }
}

/* Text tokens [at, at + n) counting on from `first` (`largest` the largest position before
 * them): the tokens of runs among them written where they are decoded, the others where they
 * are placed, each once; the runs whose token before lies here settled. */
void
decoding_ramp(Decoding *d, int form, char *const row[3], int64_t at, int64_t n, double first, double largest)
{
    const int64_t end = at + n;
    int64_t from = at;
    for (Py_ssize_t k = d->current; k < d->runs && d->run[k].start < end; k++) {
        DecodedRun *run = &d->run[k];
        decoding_settle(d, form, at, run->start - at, first, 1, largest);
        const int64_t lo = run->start > from ? run->start : from, hi = run->end < end ? run->end : end;
        values_ramp3(form, row, from, lo - from, from - at, first);
        decoded_piece(row, lo, hi - lo, run->delta);
        if (run->written == lo)
            run->written = hi;
        from = hi;
    }
    values_ramp3(form, row, from, end - from, from - at, first);
    decoding_settle(d, form, at, n, first, 1, largest);
}

/* What is left of each run written over the sample's int64 rows; returns whether the sample
 * ends in a run, whose delta is then `*last_delta`. */
int
decoding_write(const Decoding *d, char *const row[3], int64_t count, int64_t *last_delta)
{
    for (Py_ssize_t k = 0; k < d->runs; k++) {
        const DecodedRun *run = &d->run[k];
        for (int r = 0; r < 3 && run->written < run->end; r++)
            ramp((int64_t *)row[r] + run->written, run->end - run->written, run->written + run->delta);
    }
    if (d->runs && d->run[d->runs - 1].end == count) {
        *last_delta = d->run[d->runs - 1].delta;
        return 1;
    }
    return 0;
}

void
decoding_free(Decoding *d)
{
    PyMem_RawFree(d->run);
    d->run = NULL;
    d->runs = d->capacity = 0;
}
