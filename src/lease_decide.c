/*-------------------------------------------------------------------------
 *
 * lease_decide.c
 *	  The judgment of a lease: free, held, expired, released, taken over.
 *
 * Both ways of writing a lease call lease_decide: the fast path
 * (lease_fastpath.c) on the row version it is about to lock, and the
 * statements (lease.c) on the row they have locked.  Each reads the clock
 * only once it holds the table lock and the row lock the write needs (or,
 * in the fast path, right before taking the row lock without waiting), so
 * that no wait, behind LOCK TABLE, VACUUM FULL, ALTER EXTENSION UPDATE or a
 * fencing transaction, can make a lease that expired meanwhile look held.
 * Keeping the judgment here, once, is what keeps the two paths the same.
 *
 * IDENTIFICATION
 *	  src/lease_decide.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "floor_state.h"
#include "lease.h"
#include "lockfence.h"

/*
 * The longest TTL (documented in README.md, lease functions): a lease is
 * renewed, not granted for ever.
 */
#define LEASE_MAX_TTL_YEARS		100

/*
 * A TTL whose months, days or time alone go beyond this is judged by its
 * fields' signs, not added to the current time: three such fields added to
 * it could leave the range of a timestamp (4713 BC), which would fail with
 * 22008 instead of saying what is wrong with the TTL.  Each alone is far
 * above the maximum anyway.
 */
#define LEASE_TTL_FIELD_YEARS	1000

/* now + ttl, with the session's time zone for day and month units. */
static TimestampTz
lease_expiry(TimestampTz now, Interval *ttl)
{
	return DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
												   TimestampTzGetDatum(now),
												   PointerGetDatum(ttl)));
}

/*
 * now + ttl for a grant or renewal of lease name, which must be later than
 * now: every expiry a grant or renewal writes is judged here, before the
 * write, so that no lease is ever written expired.  A day or a month
 * counts by the session's time zone.  A given TTL (own_ttl false) was
 * judged when the call began (lease_check_ttl), but after a wait (for the
 * lease, its row or its resource) a change of that zone's offset in
 * between (a daylight saving time rule) can make '1 day -86430 seconds'
 * negative.  The lease's own TTL, for a renewal without one, was judged
 * when it was granted, from another date: '1 month -30 days' is a day from
 * a date in December, a negative time from one in February.
 */
static TimestampTz
lease_expiry_checked(const char *name, TimestampTz now, Interval *ttl,
					 bool own_ttl)
{
	TimestampTz expiry = lease_expiry(now, ttl);

	if (expiry > now)
		return expiry;
	if (own_ttl)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease ttl must be positive"),
				 errdetail("lockfence.lease_renew() renewed lease \"%s\" with its own ttl, which added to the current time does not give a later time (months and days count by the calendar).",
						   name),
				 errhint("Renew with a ttl such as '30 seconds'.")));
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("lease ttl must be positive"),
			 errdetail("The ttl %s given for lease \"%s\" gave a later time when the call began, but added to the current time no longer does: months and days count by the calendar of the session's time zone, whose offset changed while the call waited.",
					   DatumGetCString(DirectFunctionCall1(interval_out,
														   PointerGetDatum(ttl))),
					   name),
			 errhint("Give a ttl in hours, minutes or seconds, such as '30 seconds'.")));
	pg_unreachable();
}

/*
 * Check a TTL given to func for lease name: it must give a time later than
 * now (months and days count by the calendar, so '-1 month +30 days 12
 * hours' may not), and at most LEASE_MAX_TTL_YEARS later.
 */
void
lease_check_ttl(const char *func, const char *name, Interval *ttl)
{
	TimestampTz now = GetCurrentTimestamp();
	Interval	max_ttl = {0};
	const double max_field_days = LEASE_TTL_FIELD_YEARS * 366.0;
	bool		huge;
	bool		positive;
	bool		too_long;

	max_ttl.month = LEASE_MAX_TTL_YEARS * MONTHS_PER_YEAR;
	huge = fabs((double) ttl->month) > max_field_days / 28 ||
		fabs((double) ttl->day) > max_field_days ||
		fabs((double) ttl->time) > max_field_days * USECS_PER_DAY;
	if (huge)
	{
		/*
		 * Far beyond either bound: a TTL whose fields all point one way is
		 * too long or not positive; one whose fields disagree is not judged
		 * (counting a month as 30 days would give a wrong verdict).
		 */
		bool		forward = ttl->month >= 0 && ttl->day >= 0 && ttl->time >= 0;
		bool		backward = ttl->month <= 0 && ttl->day <= 0 && ttl->time <= 0;

		if (!forward && !backward)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("lease ttl is out of range"),
					 errdetail("%s was called for lease \"%s\" with ttl %s, whose months, days and time have opposite signs, one of them beyond %d years.",
							   func, name,
							   DatumGetCString(DirectFunctionCall1(interval_out,
																   PointerGetDatum(ttl))),
							   LEASE_TTL_FIELD_YEARS),
					 errhint("Give a ttl such as '30 seconds'.")));
		positive = forward;
		too_long = forward;
	}
	else
	{
		TimestampTz expiry = lease_expiry(now, ttl);

		positive = expiry > now;
		too_long = expiry > lease_expiry(now, &max_ttl);
	}

	if (too_long)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease ttl must be at most %d years",
						LEASE_MAX_TTL_YEARS),
				 errdetail("%s was called for lease \"%s\" with ttl %s.",
						   func, name,
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   PointerGetDatum(ttl)))),
				 errhint("Give a shorter ttl, and renew the lease to keep it longer.")));
	if (!positive)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease ttl must be positive"),
				 errdetail("%s was called for lease \"%s\" with ttl %s, which added to the current time does not give a later time (months and days count by the calendar).",
						   func, name,
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   PointerGetDatum(ttl)))),
				 errhint("Give a ttl such as '30 seconds'.")));
}

/*
 * Judge op on the fence row of lease name (NULL: it has none) at now,
 * which the caller read after locking the table and while holding (or just
 * before taking, without waiting) the row lock.
 *
 * A grant takes a free lease: never granted, expired, or released; a
 * renewal or release needs the unexpired lease of token.  When the
 * operation applies, returns LEASE_WRITE with *newrow the row to write
 * (the next token for a grant, a new expiry for a renewal, -infinity for a
 * release, so that no clock jump revives it); otherwise says why not.
 * token is that of a renewal or release; holder and ttl (NULL for a
 * renewal: the lease's own TTL) those given by the caller.  Raises 22023
 * when the expiry that a grant or a renewal would write is not later than
 * now.
 */
LeaseVerdict
lease_decide(const char *name, LeaseOp op, const FenceRow *row, int64 token,
			 const char *holder, Interval *ttl, TimestampTz now,
			 FenceRow *newrow)
{
	bool		unexpired = row != NULL && row->leased &&
		row->lease_expires_at > now;
	bool		own_ttl;

	if (row != NULL)
		*newrow = *row;
	else
		memset(newrow, 0, sizeof(FenceRow));

	if (op == LEASE_OP_GRANT)
	{
		if (unexpired)
			return LEASE_HELD;
		/*
		 * A new name starts above the failover floor (0 when none); (1.14)
		 * so does a name whose row is below it (floor_state.c).
		 */
		newrow->token = row != NULL ?
			Max(row->token, floor_state_cached()->floor) :
			lockfence_failover_floor();
		if (newrow->token == PG_INT64_MAX)
			return LEASE_TOKENS_EXHAUSTED;
		newrow->token++;
		newrow->accepted_at = now;
		newrow->holder = (char *) holder;
		newrow->leased = true;
		newrow->lease_expires_at = lease_expiry_checked(name, now, ttl, false);
		newrow->lease_ttl = ttl;
		return LEASE_WRITE;
	}

	if (row == NULL)
		return LEASE_NOT_HELD;
	if (row->token > token)
		return LEASE_TAKEN_OVER;
	if (row->token != token || !row->leased)
		return LEASE_NOT_HELD;
	if (row->lease_expires_at == DT_NOBEGIN)
		return LEASE_RELEASED;

	/*
	 * (1.15) The failover floor ends a lease below it, as raise_floor() ends
	 * one whose row it raises; on Citus a node records the floor before the
	 * coordinator raises its rows (floor_state.c), and in between the lease
	 * was renewed while every write under its token was refused (LF001).
	 * The floor is the one the failover guard read for this call: the
	 * fast path judges here with the table open, where it is not read
	 * again.  A grant still waits for such a lease, until the raise reaches
	 * its row or it expires.
	 */
	if (unlikely(token < floor_state_cached()->floor))
		return LEASE_BELOW_FLOOR;
	if (!unexpired)
		return LEASE_EXPIRED;

	if (op == LEASE_OP_RELEASE)
	{
		newrow->lease_expires_at = DT_NOBEGIN;
		return LEASE_WRITE;
	}

	/* A renewal: now + the given TTL, or the one the lease has. */
	own_ttl = ttl == NULL;
	if (own_ttl)
		ttl = row->lease_ttl;
	if (ttl == NULL)
		return LEASE_NOT_HELD;	/* every grant records its TTL */
	newrow->lease_expires_at = lease_expiry_checked(name, now, ttl, own_ttl);
	newrow->lease_ttl = ttl;
	return LEASE_WRITE;
}
