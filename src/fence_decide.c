/*-------------------------------------------------------------------------
 *
 * fence_decide.c
 *	  The judgment of a fence check: accept, stale, holder conflict, equal
 *	  token needing an advance, lease lost, failover floor.
 *
 * Every way of checking a token calls fence_decide on the fence row it
 * read, whether it read the row in C (fence_fastpath.c) or with a
 * statement (fence_store.c), and always after taking the resource lock
 * (fence_lock.c), with the clock read here, after any wait for it.  Keeping
 * the rules here, once, is what keeps the paths the same, as
 * lease_decide.c does for leases.
 *
 * IDENTIFICATION
 *	  src/fence_decide.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/timestamp.h"

#include "floor_state.h"
#include "fence_fastpath.h"
#include "lockfence.h"

/*
 * Do two holders conflict?  Only two known, different names do: a token
 * fenced without a holder, or presented without one, may be presented by
 * any holder.  Also the rule of fence_cache_covers (fence.c): a token this
 * transaction fenced counts again only for a compatible holder.
 */
bool
fence_holders_conflict(const char *recorded, const char *presented)
{
	return recorded != NULL && presented != NULL &&
		strcmp(recorded, presented) != 0;
}

/*
 * Judge token (from holder, NULL: any) against the fence row of its
 * resource (NULL: the resource has none), and say what the check does
 * next.  *outcome is filled for every action: the fence as it stands, and
 * for FENCE_ACTION_REFUSE the verdict (outcome->highest_holder points into
 * *row).  With must_advance (a token the trigger found in a row, which may
 * be a copy), an equal token is refused as FENCE_NOT_ADVANCED.
 *
 * A holder conflict and a lease that ended are reported before a missing
 * advance: they are the verdicts fence() gives for that token, and
 * fencing first, which a missing advance asks for, would not help.  A name without a row takes its
 * first token only at or above the failover floor; (1.14) a name with one
 * too, a row below the floor being one the floor's raise has not reached
 * yet (floor_state.c).
 */
FenceAction
fence_decide(const FenceRow *row, int64 token, const char *holder,
			 bool must_advance, FenceOutcome *outcome)
{
	if (row == NULL)
	{
		if (lockfence_failover_floor_rejects(token, outcome))
			return FENCE_ACTION_REFUSE;
		outcome->verdict = FENCE_ACCEPTED;
		outcome->highest = token;
		outcome->highest_holder = (char *) holder;
		outcome->leased = false;
		outcome->lease_expires_at = 0;
		outcome->below_floor = false;
		return FENCE_ACTION_INSERT;
	}

	outcome->highest = row->token;
	outcome->highest_holder = row->holder;
	outcome->leased = row->leased;
	outcome->lease_expires_at = row->lease_expires_at;
	outcome->below_floor = false;

	if (token < row->token)
		outcome->verdict = FENCE_STALE;
	else if (unlikely(lockfence_kept_floor_rejects(token, outcome)))
		return FENCE_ACTION_REFUSE;
	else if (token > row->token)
	{
		outcome->verdict = FENCE_ACCEPTED;
		return FENCE_ACTION_ADVANCE;
	}
	else if (fence_holders_conflict(row->holder, holder))
		outcome->verdict = FENCE_HOLDER_CONFLICT;
	else if (row->leased && row->lease_expires_at <= GetCurrentTimestamp())
		outcome->verdict = FENCE_LEASE_LOST;
	else if (must_advance)
		outcome->verdict = FENCE_NOT_ADVANCED;
	else
	{
		outcome->verdict = FENCE_ACCEPTED;
		return FENCE_ACTION_SHARE;
	}
	return FENCE_ACTION_REFUSE;
}
