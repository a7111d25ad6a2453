/*-------------------------------------------------------------------------
 *
 * fence_multi.c
 *	  Fencing several resources at once: fence(text[], ...) and
 *	  try_fence(text[], ...).
 *
 * Order.  A call checks its resources sorted by their bytes (strcmp, not
 * the collation, so that every session and database agrees), duplicates
 * removed.  Each accepted check keeps its fence row locked until the
 * transaction ends, and a call waits for a later resource while holding
 * the earlier ones; since every call takes its row locks in the same
 * order, no two calls can wait for each other in a cycle, so overlapping
 * sets fenced in opposite orders never deadlock.  (That holds for the rows
 * a call locks itself: a transaction that fenced some resources earlier,
 * outside this order, keeps those locks outside it.)
 *
 * All or nothing.  The checks stop at the first rejected resource (the
 * first stale one in that order, which the error names).  fence() then
 * raises: the error aborts the (sub)transaction that called it, and with
 * it every lock and advance the earlier checks took, and fence_cache.c
 * drops their cache versions with it.  try_fence() returns false instead,
 * so it runs the checks in an internal subtransaction, rolled back on a
 * rejection (undoing locks, advances and cache versions alike, the cache
 * following the subtransaction exactly as the row locks do) and released
 * when every resource was accepted.  A single check is all or nothing by
 * itself (a rejected check locks nothing), so when at most one resource
 * is not already fenced by this transaction with this token, no
 * subtransaction is needed: that keeps repeated calls cheap, and does not
 * spend a subtransaction id per call in bulk writes.
 *
 * Each resource gets exactly the check of fence(text, ...): the same
 * validation, cache, fast path, waiting and verdicts.
 *
 * IDENTIFICATION
 *	  src/fence_multi.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/resowner.h"

#include "lockfence.h"
#include "name_array.h"

PG_FUNCTION_INFO_V1(lockfence_fence_many);
PG_FUNCTION_INFO_V1(lockfence_try_fence_many);

/* The arguments of a call, resources in canonical order. */
typedef struct FenceMany
{
	char	  **resources;		/* sorted by bytes, no duplicates */
	int			count;
	int64		token;
	char	   *holder;			/* or NULL */
	const char *funcname;		/* the SQL function, for errors */
} FenceMany;

/*
 * Where an error of the checks arose, for its context line.  (Errors in
 * the array's elements get theirs from name_array_elements.)
 */
typedef struct FenceManyPosition
{
	int			index;			/* 0-based, in canonical order */
	int			count;
} FenceManyPosition;

static void
fence_many_error_context(void *arg)
{
	FenceManyPosition *pos = (FenceManyPosition *) arg;

	errcontext("fencing resource %d of %d, in byte order",
			   pos->index + 1, pos->count);
}

/* name_array_elements' validation: as fence(text, ...) validates */
static void
validate_resource(const char *resource, void *arg)
{
	lockfence_validate_resource(resource);
}

/*
 * Read the resource array: every element validated as fence(text, ...)
 * validates its resource, then sorted and deduplicated.
 */
static void
fence_many_resources(ArrayType *array, FenceMany *call)
{
	int			nelems;

	call->resources = name_array_elements(array, NAME_ARRAY_RESOURCES,
										  validate_resource, NULL, &nelems);
	call->count = name_array_sort_unique(call->resources, nelems);
}

/*
 * Read the (resources, token, holder) arguments shared by fence(text[])
 * and try_fence(text[]), validating all of them before anything is locked.
 */
static void
fence_many_args(FunctionCallInfo fcinfo, FenceMany *call)
{
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("fencing resource array must not be null")));
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("fencing token must not be null"),
				 errhint("A write without a token cannot be fenced; pass the token of the lock you hold.")));
	call->token = PG_GETARG_INT64(1);
	call->holder = (PG_NARGS() > 2 && !PG_ARGISNULL(2)) ?
		text_to_cstring(PG_GETARG_TEXT_PP(2)) : NULL;

	lockfence_validate_token(call->token);
	if (call->holder != NULL)
		lockfence_validate_holder(call->holder);
	fence_many_resources(PG_GETARG_ARRAYTYPE_P(0), call);
}

/*
 * Check the resources in canonical order, stopping at the first rejected
 * one.  Returns its index, with its outcome in *outcome, or -1 when every
 * resource was accepted.
 */
static int
fence_many_check(const FenceMany *call, FenceOutcome *outcome)
{
	FenceManyPosition pos = {0, call->count};
	ErrorContextCallback errcallback;
	int			rejected = -1;

	errcallback.callback = fence_many_error_context;
	errcallback.arg = &pos;
	errcallback.previous = error_context_stack;
	error_context_stack = &errcallback;

	for (pos.index = 0; pos.index < call->count; pos.index++)
	{
		if (lockfence_check(call->resources[pos.index], call->token,
							call->holder, false, call->funcname,
							outcome) != FENCE_ACCEPTED)
		{
			rejected = pos.index;
			break;
		}
	}

	error_context_stack = errcallback.previous;
	return rejected;
}

/*
 * Raise the error of fence_many_check's rejection, with the context line
 * that says where in the call it happened.
 */
static void
fence_many_report(const FenceMany *call, int rejected,
				  const FenceOutcome *outcome)
{
	FenceManyPosition pos = {rejected, call->count};
	ErrorContextCallback errcallback;

	errcallback.callback = fence_many_error_context;
	errcallback.arg = &pos;
	errcallback.previous = error_context_stack;
	error_context_stack = &errcallback;

	lockfence_report_rejection(call->resources[rejected], call->token,
							   call->holder, outcome);

	error_context_stack = errcallback.previous;
}

/*
 * How many resources need a check of the fence table: those this
 * transaction has not fenced with this token already.
 */
static int
fence_many_uncovered(const FenceMany *call)
{
	int			n = 0;

	for (int i = 0; i < call->count; i++)
		if (!fence_cache_covers(call->resources[i], call->token, call->holder))
			n++;
	return n;
}

/* fence_many_check's arguments and result, for lockfence_run_in_subxact */
typedef struct FenceManyStep
{
	const FenceMany *call;
	FenceOutcome *outcome;
	int			rejected;
} FenceManyStep;

static bool
fence_many_check_step(void *arg)
{
	FenceManyStep *step = (FenceManyStep *) arg;

	step->rejected = fence_many_check(step->call, step->outcome);
	return step->rejected < 0;
}

/*
 * Run fence_many_check in an internal subtransaction, kept when every
 * resource was accepted and rolled back at the first rejection, so that
 * nothing of the call stays fenced.  An error (a deadlock with a caller
 * that does not follow the order, a serialization failure, a cancel) rolls
 * the subtransaction back too before it propagates.
 */
static int
fence_many_check_atomic(const FenceMany *call, FenceOutcome *outcome)
{
	FenceManyStep step = {call, outcome, -1};

	(void) lockfence_run_in_subxact(fence_many_check_step, &step);
	return step.rejected;
}

/*
 * lockfence.fence(resources text[], token bigint, holder text DEFAULT NULL)
 *
 * Accept token for every resource in this transaction, in canonical
 * order, or raise an error with SQLSTATE LF001 naming the first rejected
 * resource; the error undoes the checks made before it.  Returns the
 * token.
 */
Datum
lockfence_fence_many(PG_FUNCTION_ARGS)
{
	FenceMany	call;
	FenceOutcome outcome;
	int			rejected;

	lockfence_refuse_parallel_mode("lockfence.fence()");

	call.funcname = "lockfence.fence()";
	fence_many_args(fcinfo, &call);
	rejected = fence_many_check(&call, &outcome);
	if (rejected >= 0)
		fence_many_report(&call, rejected, &outcome);
	PG_RETURN_INT64(call.token);
}

/*
 * lockfence.try_fence(resources text[], token bigint, holder text DEFAULT NULL)
 *
 * Like fence(text[], ...), but returns false, with none of the resources
 * fenced by this call, instead of raising on a rejected token.  Invalid
 * arguments still raise.
 */
Datum
lockfence_try_fence_many(PG_FUNCTION_ARGS)
{
	FenceMany	call;
	FenceOutcome outcome;

	lockfence_refuse_parallel_mode("lockfence.try_fence()");

	call.funcname = "lockfence.try_fence()";
	fence_many_args(fcinfo, &call);
	if (fence_many_uncovered(&call) <= 1)
		PG_RETURN_BOOL(fence_many_check(&call, &outcome) < 0);
	PG_RETURN_BOOL(fence_many_check_atomic(&call, &outcome) < 0);
}
