/*-------------------------------------------------------------------------
 *
 * lease_fastpath.c
 *	  Uncontended lease grants, renewals and releases without SPI.
 *
 * Most lease operations meet nobody: the lease is free (or held by the
 * caller), nobody holds its fence row, and nobody changed the row since
 * our snapshot.  For those, lease.c's statements cost most of the call: a
 * read, then an UPDATE in an internal subtransaction, each through the
 * executor.  These functions decide on the row as fence_fastpath_update
 * finds it, with the same conditions as the statements' WHERE clauses, and
 * write the same new values; it locks exactly the version judged, without
 * waiting, before writing the new one.
 *
 * They only ever succeed.  When they return false nothing was changed or
 * locked, and lease.c runs its statements, which wait for the row's
 * lockers (transactions that fenced with the old token, competing grants),
 * re-check, and tell why a renewal or release failed.  No subtransaction is
 * needed here: a version that is locked or changed is refused before any
 * lock is taken, so no stray lock can outlive the call.
 *
 * The clock is the server's, as in the statements (clock_timestamp()), read
 * once per call.
 *
 * IDENTIFICATION
 *	  src/lease_fastpath.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "lease.h"
#include "lockfence.h"

/* What the edits below need besides the row. */
typedef struct LeaseEdit
{
	TimestampTz now;
	int64		token;			/* renew, release: the lease's token */
	const char *holder;			/* grant: the new holder */
	Interval   *ttl;			/* grant, renew: NULL for the lease's own */
} LeaseEdit;

/* now + ttl, with the session's time zone for day and month units. */
static TimestampTz
lease_expiry(TimestampTz now, Interval *ttl)
{
	return DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
												   TimestampTzGetDatum(now),
												   PointerGetDatum(ttl)));
}

/*
 * A grant, if the lease is free: never granted, expired or released (the
 * WHERE clause of LEASE_GRANT).  A token at the top of the range is left to
 * the statement, which reports the overflow.
 */
static bool
lease_edit_grant(const FenceRow *row, FenceRow *newrow, void *arg)
{
	LeaseEdit  *e = (LeaseEdit *) arg;

	if ((row->leased && row->lease_expires_at > e->now) ||
		row->token == PG_INT64_MAX)
		return false;
	newrow->token = row->token + 1;
	newrow->accepted_at = e->now;
	newrow->holder = (char *) e->holder;
	newrow->leased = true;
	newrow->lease_expires_at = lease_expiry(e->now, e->ttl);
	newrow->lease_ttl = e->ttl;
	return true;
}

/* Is the row the unexpired lease of the token (LEASE_RENEW, LEASE_RELEASE)? */
static bool
lease_edit_held(const FenceRow *row, const LeaseEdit *e)
{
	return row->token == e->token && row->leased &&
		row->lease_expires_at > e->now;
}

/* A renewal: now + the given TTL, or the lease's own. */
static bool
lease_edit_renew(const FenceRow *row, FenceRow *newrow, void *arg)
{
	LeaseEdit  *e = (LeaseEdit *) arg;
	Interval   *ttl = e->ttl ? e->ttl : row->lease_ttl;

	if (!lease_edit_held(row, e) || ttl == NULL)
		return false;
	newrow->lease_expires_at = lease_expiry(e->now, ttl);
	newrow->lease_ttl = ttl;
	return true;
}

/* A release: -infinity, so that no clock jump revives the lease. */
static bool
lease_edit_release(const FenceRow *row, FenceRow *newrow, void *arg)
{
	LeaseEdit  *e = (LeaseEdit *) arg;

	if (!lease_edit_held(row, e))
		return false;
	newrow->lease_expires_at = DT_NOBEGIN;
	return true;
}

/*
 * Grant name to holder for ttl if the lease is free and its row
 * uncontended.  Returns true with the row before (for the metrics) and
 * after the grant.
 */
bool
lease_fastpath_grant(const char *name, const char *holder, Interval *ttl,
					 FenceRow *prev, FenceRow *row)
{
	LeaseEdit	e = {GetCurrentTimestamp(), 0, holder, ttl};

	return fence_fastpath_update(name, lease_edit_grant, &e, prev, row);
}

/*
 * Renew the unexpired lease of token for ttl (NULL: its own TTL) if its
 * row is uncontended.  Returns true with the row as renewed.
 */
bool
lease_fastpath_renew(const char *name, int64 token, Interval *ttl,
					 FenceRow *row)
{
	LeaseEdit	e = {GetCurrentTimestamp(), token, NULL, ttl};
	FenceRow	before;

	return fence_fastpath_update(name, lease_edit_renew, &e, &before, row);
}

/*
 * Release the unexpired lease of token if its row is uncontended.  Returns
 * true with the row as released.
 */
bool
lease_fastpath_release(const char *name, int64 token, FenceRow *row)
{
	LeaseEdit	e = {GetCurrentTimestamp(), token, NULL, NULL};
	FenceRow	before;

	return fence_fastpath_update(name, lease_edit_release, &e, &before, row);
}
