/* Temporal ids: a frame's index scaled by the seconds per grid and the positions per second,
 * in the arithmetic a rule gives as data, truncated or not. */
#include "native.h"

#include <math.h>

/* The rule for seconds of `seconds_type`, its precision the arithmetic numpy gives them where it
 * is the seconds' (PRECISION_SECONDS): float seconds keep theirs; whole seconds (integers, or
 * truncated first) give int64 for a whole per_second, else float64 (float32 multiplying frame
 * first), as numpy forms per_second * seconds and frame * seconds * per_second. */
TemporalRule
temporal_rule_for(const TemporalRule *rule, int seconds_type)
{
    TemporalRule resolved = *rule;
    if (rule->precision != PRECISION_SECONDS)
        return resolved;
    if (seconds_type == SECONDS_INT64 || rule->whole_seconds)
        resolved.precision = rule->per_second_whole ? PRECISION_INT64
                                                    : (rule->frame_first ? PRECISION_FLOAT32 : PRECISION_FLOAT64);
    else
        resolved.precision = seconds_type == SECONDS_FLOAT32 ? PRECISION_FLOAT32 : PRECISION_FLOAT64;
    return resolved;
}

/* The rule applied to one grid's seconds; -1 for seconds it cannot scale (negative, not finite,
 * or beyond 2**31 where whole seconds are taken). */
int
temporal_scale(const TemporalRule *rule, double seconds, TemporalScale *scale)
{
    if (!(seconds >= 0 && seconds < INFINITY))
        return -1;
    if (rule->whole_seconds) {
        if (!(seconds < 2147483648.0))
            return -1;
        seconds = (double)(int64_t)seconds;
    }
    *scale = (TemporalScale){rule->frame_first, rule->precision, rule->truncate};
    switch (rule->precision) {
    case PRECISION_INT64:
        scale->scale_int = (int64_t)rule->per_second * (int64_t)seconds;
        break;
    case PRECISION_FLOAT32:
        scale->seconds32 = (float)seconds;
        scale->per_second32 = (float)rule->per_second;
        scale->scale32 = scale->per_second32 * scale->seconds32;
        break;
    default:
        scale->seconds64 = seconds;
        scale->per_second64 = rule->per_second;
        scale->scale64 = rule->per_second * seconds;
    }
    return 0;
}

/* Frame `frame`'s temporal id truncated toward zero, as numpy's astype(int64) gives it; -1 where
 * it would not lie in [0, 2**62) (int64 rules: a scale beyond 2**40). */
int
temporal_truncated(const TemporalScale *s, int64_t frame, int64_t *id)
{
    if (s->precision == PRECISION_INT64) {
        if (s->scale_int < 0 || s->scale_int > ((int64_t)1 << 40) || frame > ((int64_t)1 << 22))
            return -1;
        *id = frame * s->scale_int;
        return 0;
    }
    const double value = temporal_product(s, frame);
    if (!(value >= 0 && value < 4611686018427387904.0))
        return -1;
    *id = (int64_t)value;
    return 0;
}
