/*-------------------------------------------------------------------------
 *
 * fence.c
 *	  The fence check and its SQL functions: fence, try_fence,
 *	  current_token and reset.
 *
 * A check is answered from the transaction's cache when this transaction
 * already fenced the same token for the resource (it holds the resource
 * lock until it ends, fence_lock.c), and from the fence table otherwise.
 *
 * fence() and try_fence() accept a token equal to the recorded fence: the
 * caller says it holds the lock that token came from.  The trigger asks
 * for more of a token it finds in a row (must_advance): a value equal to
 * the fence may have been copied from the table, so unless this
 * transaction fenced it already, only a higher token counts there.
 *
 * IDENTIFICATION
 *	  src/fence.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "failover_guard.h"
#include "fence_lock.h"
#include "lockfence.h"
#include "metrics.h"

PG_FUNCTION_INFO_V1(lockfence_fence);
PG_FUNCTION_INFO_V1(lockfence_try_fence);
PG_FUNCTION_INFO_V1(lockfence_current_token);
PG_FUNCTION_INFO_V1(lockfence_reset);

/*
 * Told of every accepted fence, with its holder: the etcd session marks
 * the lock a holder names for its commit-time check.  Registered by
 * lockfence_etcd_init (etcd_sql.c), so that this file does not call the
 * etcd client.
 */
static FenceAcceptedCallback fence_accepted_callback = NULL;

void
lockfence_on_fence_accepted(FenceAcceptedCallback callback)
{
	fence_accepted_callback = callback;
}

static void
fence_accepted(const char *holder)
{
	if (fence_accepted_callback != NULL)
		fence_accepted_callback(holder);
}

/*
 * Raise the error for a rejected token.
 */
void
lockfence_report_rejection(const char *resource, int64 token,
						   const char *holder, const FenceOutcome *outcome)
{
	Assert(outcome->verdict == FENCE_STALE ||
		   outcome->verdict == FENCE_HOLDER_CONFLICT ||
		   outcome->verdict == FENCE_LEASE_LOST);

	if (outcome->verdict == FENCE_LEASE_LOST)
		ereport(ERROR,
				(errcode(ERRCODE_LOCKFENCE_LOCK_LOST),
				 errmsg("lease for resource \"%s\" is no longer held", resource),
				 outcome->lease_expires_at == DT_NOBEGIN ?
				 errdetail("The lease of token " INT64_FORMAT " was released.", token) :
				 errdetail("The lease of token " INT64_FORMAT " expired at %s.",
						   token, timestamptz_to_str(outcome->lease_expires_at)),
				 errhint("The lock protecting this resource was lost; acquire the lease again to get a new token.")));

	if (outcome->verdict == FENCE_HOLDER_CONFLICT)
		ereport(ERROR,
				(errcode(ERRCODE_LOCKFENCE_STALE_TOKEN),
				 errmsg("fencing token for resource \"%s\" belongs to another holder",
						resource),
				 errdetail("Token " INT64_FORMAT " was accepted from holder \"%s\" and is now presented by holder \"%s\".",
						   token, outcome->highest_holder, holder),
				 errhint("The lock protecting this resource was lost or handed out twice; acquire it again to get a new token.")));

	/* The floor is the lowest token accepted, not one already accepted. */
	ereport(ERROR,
			(errcode(ERRCODE_LOCKFENCE_STALE_TOKEN),
			 errmsg("stale fencing token for resource \"%s\"", resource),
			 outcome->below_floor ?
			 errdetail("Token " INT64_FORMAT " is below the failover floor, " INT64_FORMAT ": the lowest token accepted since raise_floor() set it.",
					   token, outcome->highest) :
			 errdetail("Token " INT64_FORMAT " was presented, but token " INT64_FORMAT " has already been accepted.",
					   token, outcome->highest),
			 outcome->below_floor ?
			 errhint("The token was issued before the floor was raised; acquire the lock again to get a new token.") :
			 errhint("The lock protecting this resource was lost; acquire it again to get a new token.")));
}

/*
 * Has this transaction already fenced resource with token, for a holder
 * compatible with holder?  Then it holds the resource lock, and the check
 * needs no table access.
 */
bool
fence_cache_covers(const char *resource, int64 token, const char *holder)
{
	int64		cached_token;
	const char *cached_holder;

	if (!fence_cache_lookup(resource, &cached_token, &cached_holder))
		return false;
	/* The cache stands for the resource lock: both follow savepoints. */
	Assert(fence_lock_held(resource, ShareLock) ||
		   fence_lock_held(resource, ExclusiveLock));
	return cached_token == token &&
		!fence_holders_conflict(cached_holder, holder);
}

/*
 * Check token (with an optional holder) for resource in the current
 * transaction.  On acceptance the fence is advanced if the token is higher
 * and the resource lock is held until the transaction ends.  With
 * must_advance, a token equal to the recorded fence that this transaction
 * has not fenced yet is refused (FENCE_NOT_ADVANCED).
 *
 * Returns the verdict, with the fence as it stands in *outcome (not filled
 * when answered from the cache).  Stale tokens and holder conflicts are
 * counted and logged here, once; raising is the caller's choice.
 * funcname names the SQL function called, for the error of a check in a
 * read-only transaction.
 */
FenceVerdict
lockfence_check(const char *resource, int64 token, const char *holder,
				bool must_advance, const char *funcname,
				FenceOutcome *outcome)
{
	lockfence_validate_resource(resource);
	lockfence_validate_token(token);
	if (holder != NULL)
		lockfence_validate_holder(holder);
	lockfence_failover_guard();

	if (fence_cache_covers(resource, token, holder))
	{
		lockfence_metrics_fence_accepted();
		fence_accepted(holder);
		return FENCE_ACCEPTED;
	}

	fence_store_check(resource, token, holder, must_advance, funcname,
					  outcome);

	switch (outcome->verdict)
	{
		case FENCE_ACCEPTED:
			fence_cache_remember(resource, outcome->highest,
								 outcome->highest_holder);
			lockfence_metrics_fence_accepted();
			fence_accepted(holder);
			break;
		case FENCE_STALE:
		case FENCE_HOLDER_CONFLICT:
		case FENCE_LEASE_LOST:
			lockfence_metrics_fence_rejected(resource, token, holder, outcome);
			break;
		case FENCE_NOT_ADVANCED:
			/* the caller reports it as a write without a token */
			break;
	}
	return outcome->verdict;
}

/*
 * Read the (resource, token, holder) arguments shared by fence and
 * try_fence; resource and token must not be NULL.
 */
static void
fence_args(FunctionCallInfo fcinfo, char **resource, int64 *token,
		   char **holder)
{
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("fencing resource must not be null")));
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("fencing token must not be null"),
				 errhint("A write without a token cannot be fenced; pass the token of the lock you hold.")));
	*resource = text_to_cstring(PG_GETARG_TEXT_PP(0));
	*token = PG_GETARG_INT64(1);
	*holder = (PG_NARGS() > 2 && !PG_ARGISNULL(2)) ?
		text_to_cstring(PG_GETARG_TEXT_PP(2)) : NULL;
}

/*
 * lockfence.fence(resource text, token bigint, holder text DEFAULT NULL)
 *
 * Accept token for resource in this transaction, or raise an error with
 * SQLSTATE LF001.  Returns the token.
 */
Datum
lockfence_fence(PG_FUNCTION_ARGS)
{
	char	   *resource;
	int64		token;
	char	   *holder;
	FenceOutcome outcome;

	lockfence_refuse_parallel_mode("lockfence.fence()");

	fence_args(fcinfo, &resource, &token, &holder);
	if (lockfence_check(resource, token, holder, false, "lockfence.fence()",
						&outcome) !=
		FENCE_ACCEPTED)
		lockfence_report_rejection(resource, token, holder, &outcome);
	PG_RETURN_INT64(token);
}

/*
 * lockfence.try_fence(resource text, token bigint, holder text DEFAULT NULL)
 *
 * Like fence, but returns false instead of raising on a rejected token.
 * Invalid arguments still raise.
 */
Datum
lockfence_try_fence(PG_FUNCTION_ARGS)
{
	char	   *resource;
	int64		token;
	char	   *holder;
	FenceOutcome outcome;

	lockfence_refuse_parallel_mode("lockfence.try_fence()");

	fence_args(fcinfo, &resource, &token, &holder);
	PG_RETURN_BOOL(lockfence_check(resource, token, holder, false,
								   "lockfence.try_fence()",
								   &outcome) == FENCE_ACCEPTED);
}

/*
 * lockfence.current_token(resource text) returns the highest token accepted
 * for resource, or NULL if none was.
 */
Datum
lockfence_current_token(PG_FUNCTION_ARGS)
{
	char	   *resource;
	int64		token;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("fencing resource must not be null")));
	resource = text_to_cstring(PG_GETARG_TEXT_PP(0));
	lockfence_validate_resource(resource);

	if (!fence_store_current(resource, &token))
		PG_RETURN_NULL();
	PG_RETURN_INT64(token);
}

/*
 * lockfence.reset(resource text) forgets the fence of resource, so that the
 * next token at or above the failover floor is accepted (fence_decide.c:
 * a name without a row).  For operators (not executable by PUBLIC): e.g.
 * after moving a resource to a lock service whose tokens start lower.
 * Returns false if the resource had no fence.
 */
Datum
lockfence_reset(PG_FUNCTION_ARGS)
{
	char	   *resource;
	bool		found;

	lockfence_refuse_parallel_mode("lockfence.reset()");
	PreventCommandIfReadOnly("lockfence.reset()");

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("fencing resource must not be null")));
	resource = text_to_cstring(PG_GETARG_TEXT_PP(0));
	lockfence_validate_resource(resource);

	found = fence_store_delete(resource);
	fence_cache_forget(resource);
	PG_RETURN_BOOL(found);
}
