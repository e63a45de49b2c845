/* Merging a grid's frames and a sequence's tokens (a video's and its audio's) by time. The
 * sequence's tokens take one position each from the block's start, the frames their temporal
 * ids; each rule returns the largest position of the part it placed last. */
#include "native.h"

/* Tokens in order of position: the sequence's tokens before each frame are those whose position
 * is below the frame's time; the frame first on a tie. A frame's tokens share its time, so the
 * sequence comes between frames only. */
static double
by_time(int form, char *const row[3], int64_t at, GridBlock *g, int64_t tokens)
{
    int64_t heard = 0;
    for (int64_t frame = 0; frame < g->frames; frame++) {
        const double time = values_add(form, grid_temporal(g, frame), g->start);
        int64_t until = heard;
        while (until < tokens && values_add(form, (double)until, g->start) < time)
            until++;
        values_ramp3(form, row, at, until - heard, heard, g->start);
        at += until - heard;
        heard = until;
        grid_frame(form, row, at, g, frame);
        at += g->height * g->width;
    }
    values_ramp3(form, row, at, tokens - heard, heard, g->start);
    const double last_heard = values_add(form, (double)(tokens - 1), g->start);
    const double last_seen = values_add(form, grid_temporal(g, g->frames - 1), g->start);
    return last_heard >= last_seen ? last_heard : grid_largest(form, g);
}

/* Both cut into chunks of `chunk` positions, the grid's chunk j then the sequence's: the grid's
 * chunk ends before the first token whose temporal id reaches the next multiple of `chunk`
 * (one new chunk per token at most). */
static double
by_chunks(int64_t chunk, int form, char *const row[3], int64_t at, GridBlock *g, int64_t tokens)
{
    const int64_t per_frame = g->height * g->width, grid_tokens = g->frames * per_frame;
    int64_t seen = 0, heard = 0, tested = 0, reached = 1, grid_chunks = 0, sequence_chunks = 0;
    while (seen < grid_tokens || heard < tokens) {
        if (seen < grid_tokens) {
            int64_t end = grid_tokens;
            while (tested < grid_tokens) {  /* the next token that starts a chunk */
                const int64_t frame = tested / per_frame;
                if (grid_temporal(g, frame) >= (double)(reached * chunk)) {
                    end = tested++;
                    reached++;
                    break;
                }
                tested = (frame + 1) * per_frame;  /* the frame's other tokens have its temporal id */
            }
            grid_range(form, row, at, g, seen, end);
            at += end - seen;
            seen = end;
            grid_chunks++;
        }
        if (heard < tokens) {
            const int64_t end = heard + chunk < tokens ? heard + chunk : tokens;
            values_ramp3(form, row, at, end - heard, heard, g->start);
            at += end - heard;
            heard = end;
            sequence_chunks++;
        }
    }
    if (sequence_chunks >= grid_chunks)
        return values_add(form, (double)(tokens - 1), g->start);
    return grid_largest(form, g);
}

/* The frames grouped by temporal id // `chunk` (a group without frames takes nothing), each
 * group's frames then the next `chunk` tokens of the sequence, what is left of it at the end. */
static double
by_groups(int64_t chunk, int form, char *const row[3], int64_t at, GridBlock *g, int64_t tokens)
{
    const int64_t per_frame = g->height * g->width;
    int64_t heard = 0, taken = 0;
    for (int64_t frame = 0; frame < g->frames;) {
        const int64_t group = (int64_t)grid_temporal(g, frame) / chunk;
        int64_t end = frame + 1;
        while (end < g->frames && (int64_t)grid_temporal(g, end) / chunk == group)
            end++;
        grid_range(form, row, at, g, frame * per_frame, end * per_frame);
        at += (end - frame) * per_frame;
        taken = tokens - heard < chunk ? tokens - heard : chunk;
        values_ramp3(form, row, at, taken, heard, g->start);
        at += taken;
        heard += taken;
        frame = end;
    }
    values_ramp3(form, row, at, tokens - heard, heard, g->start);
    if (taken || heard < tokens)  /* placed last: the sequence's tokens, else the last group's frames */
        return values_add(form, (double)(tokens - 1), g->start);
    return grid_largest(form, g);
}

double
interleave(int rule, int64_t chunk, int form, char *const row[3], int64_t at, GridBlock *g, int64_t tokens)
{
    switch (rule) {
    case INTERLEAVE_TIME:
        return by_time(form, row, at, g, tokens);
    case INTERLEAVE_CHUNKS:
        return by_chunks(chunk, form, row, at, g, tokens);
    default:
        return by_groups(chunk, form, row, at, g, tokens);
    }
}
