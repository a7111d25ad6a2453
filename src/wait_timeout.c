/*-------------------------------------------------------------------------
 *
 * wait_timeout.c
 *	  The wait_timeout argument of the waiting calls (the etcd locks of
 *	  etcd_sql.c, lease_acquire of lease.c), read one way for all, and
 *	  the time left until a deadline, counted one way for all.
 *
 * IDENTIFICATION
 *	  src/wait_timeout.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/int.h"
#include "utils/timestamp.h"

#include "wait_timeout.h"

/* wait_timeout from which on a wait has no limit: 10,000 years */
#define WAIT_FOREVER_USECS	((int64) 3652425 * USECS_PER_DAY)

/*
 * The length of a wait_timeout in microseconds (a month counting 30
 * days, as interval arithmetic does), in *usecs; WAIT_TIMEOUT_FOREVER
 * for 10,000 years or more (including +infinity): no wait outlasts that,
 * and a deadline much further away would not fit in a timestamp.
 * Returns false, the caller raising its error, for a negative one.
 *
 * The span is computed without overflow: an interval of more than about
 * 292,000 years would otherwise wrap around to a short or negative one.
 */
bool
wait_timeout_usecs(const Interval *span, int64 *usecs)
{
	int64		days = (int64) span->month * DAYS_PER_MONTH + span->day;
	int64		total;

	if (pg_mul_s64_overflow(days, USECS_PER_DAY, &total) ||
		pg_add_s64_overflow(total, span->time, &total))
	{
		/* the sign of the exact sum, from an approximation that cannot overflow */
		double		approx = (double) days * USECS_PER_DAY + (double) span->time;

		total = approx < 0 ? -1 : PG_INT64_MAX;
	}
	if (total < 0)
		return false;
	*usecs = total >= WAIT_FOREVER_USECS ? WAIT_TIMEOUT_FOREVER : total;
	return true;
}

/*
 * Milliseconds left until deadline, rounded up: 0 only once it has
 * passed.  Every wait and request cut to a wait_timeout's deadline counts
 * with this: rounded down, they ended up to a millisecond before it (a
 * set of two etcd locks failed 0.2 ms early), and a wait_timeout must
 * never fire before it passed.
 */
long
wait_ms_until(TimestampTz deadline)
{
	TimestampTz now = GetCurrentTimestamp();

	if (now >= deadline)
		return 0;
	return (long) ((deadline - now + 999) / 1000);
}
