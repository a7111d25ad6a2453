/*-------------------------------------------------------------------------
 *
 * etcd_lock_many.c
 *	  Several etcd locks taken by one call (etcd_lock_many, and
 *	  etcd_lock_and_fence with one lock or several), all or nothing, in a
 *	  canonical order.
 *
 * Order.  A call takes its locks sorted by the bytes of their names
 * (strcmp, not the collation, so that every session and database agrees),
 * duplicates removed, each with etcd_lock_acquire, waiting for a later
 * name while holding the earlier ones.  Since every call waits in the
 * same order, no two calls can wait for each other in a cycle: overlapping
 * sets requested in opposite orders never deadlock.  (That holds for the
 * locks a call takes itself: locks its session took earlier, or that
 * etcdctl or another client hold, are outside the order.)  wait_timeout
 * bounds the whole call: each acquisition gets what is left of it.
 *
 * All or nothing.  The locks stay pending (etcd_lock.c) until every one
 * is held and the call's own step (the fences of etcd_lock_and_fence, the
 * result rows) has succeeded; only then are they handed over together.
 * Any error before that (a lock that times out, is lost, or is cancelled;
 * a rejected fence) releases every lock the call took, each by the
 * per-lock path of a failed acquisition (etcd_lock_release_after_error),
 * newest first, before the error propagates: a caller that never learned
 * the keys owns none of them.  Those releases share one cleanup budget
 * (etcd_acquire_cleanup_budget_ms, short after a cancel or wait_timeout);
 * locks left over when it runs out are given up at once, their keys going
 * with their leases (revoked at exit, or expired with the TTL), so the
 * error is not delayed by a second budget at the abort.
 *
 * etcd_lock_and_fence fences each resource with the token of its own lock,
 * holder the lock's key, resources in byte order like fence(text[], ...),
 * after every lock is held; a rejected fence raises, which undoes the
 * fences made before it with the (sub)transaction.  Every lock is then
 * marked fenced, so the commit-time check (etcd_commit_check.c) confirms
 * each of them.
 *
 * IDENTIFICATION
 *	  src/etcd_lock_many.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "error_cleanup.h"
#include "etcd.h"
#include "lockfence.h"
#include "name_array.h"
#include "wait_timeout.h"

/* lockfence.fence(resource, token, holder) (fence.c) */
extern Datum lockfence_fence(PG_FUNCTION_ARGS);

/* What a call was doing when an error arose, for its context line. */
typedef enum LockManyStep
{
	STEP_ACQUIRE,				/* acquiring the locks */
	STEP_FENCE					/* fencing the resources */
} LockManyStep;

typedef struct LockManyPosition
{
	LockManyStep step;
	int			index;			/* 0-based, in array or canonical order */
	int			count;
} LockManyPosition;

static void
lock_many_error_context(void *arg)
{
	LockManyPosition *pos = (LockManyPosition *) arg;

	/* a call with one lock or resource needs no position */
	if (pos->count <= 1)
		return;
	switch (pos->step)
	{
		case STEP_ACQUIRE:
			errcontext("acquiring etcd lock %d of %d, in byte order",
					   pos->index + 1, pos->count);
			break;
		case STEP_FENCE:
			errcontext("fencing resource %d of %d, in byte order",
					   pos->index + 1, pos->count);
			break;
	}
}

/*
 * Refuse a lock name whose key ("<name>/" and up to 16 hex digits) might
 * not fit in a fence's holder: etcd_lock_and_fence fences with the key as
 * holder, and must find that out before contacting etcd.
 */
void
etcd_lock_check_holder_name(const char *name)
{
	if (strlen(name) + 1 + 16 > LOCKFENCE_MAX_HOLDER_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("etcd lock name is too long for etcd_lock_and_fence"),
				 errdetail("The lock key, the name followed by \"/\" and up to 16 hexadecimal digits, is the fence's holder, which is limited to %d bytes.",
						   LOCKFENCE_MAX_HOLDER_BYTES)));
}

/*
 * name_array_elements' validation of a lock name; arg: must it fit a
 * holder.  The holder's limit is checked first, as etcd_lock_and_fence's
 * single form does, so that any name over it gets 22001, also one beyond
 * the 1024 bytes of any lock name.
 */
static void
validate_lock_name(const char *name, void *arg)
{
	if (*(bool *) arg)
		etcd_lock_check_holder_name(name);
	etcd_lock_check_args(name, 1);	/* 1: any valid TTL */
}

/* name_array_elements' validation of a fencing resource */
static void
validate_resource(const char *resource, void *arg)
{
	lockfence_validate_resource(resource);
}

/*
 * Make set the lock set of names (n of them, valid): sorted by bytes,
 * duplicates removed, at most ETCD_MAX_LOCKS_PER_CALL.  names is sorted
 * in place.
 */
static void
set_of_names(EtcdLockSet *set, char **names, int n)
{
	int			kept = name_array_sort_unique(names, n);

	if (kept > ETCD_MAX_LOCKS_PER_CALL)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("too many etcd lock names: %d", kept),
				 errdetail("One call takes at most %d distinct locks.",
						   ETCD_MAX_LOCKS_PER_CALL)));
	set->names = (const char **) names;
	set->count = kept;
	set->locks = palloc0(sizeof(EtcdLockResult) * kept);
	set->held = 0;
}

/*
 * The lock set of one name (etcd_lock_and_fence with one resource); the
 * name was validated by the caller.
 */
void
etcd_lock_set_of_name(EtcdLockSet *set, const char *name)
{
	char	  **names = palloc(sizeof(char *));

	names[0] = pstrdup(name);
	set_of_names(set, names, 1);
}

/*
 * The lock set of an array of names (etcd_lock_many), every element
 * validated before anything is sent to etcd.
 */
void
etcd_lock_set_of_array(EtcdLockSet *set, ArrayType *names)
{
	int			n;
	bool		holder = false;
	char	  **elems = name_array_elements(names, NAME_ARRAY_LOCK_NAMES,
											validate_lock_name, &holder, &n);

	set_of_names(set, elems, n);
}

static int
fenced_resource_cmp(const void *a, const void *b)
{
	const EtcdFencedResource *x = (const EtcdFencedResource *) a;
	const EtcdFencedResource *y = (const EtcdFencedResource *) b;
	int			c = strcmp(x->resource, y->resource);

	return c != 0 ? c : strcmp(x->name, y->name);
}

/*
 * Index of name in the set (it is there).
 */
static int
set_index(const EtcdLockSet *set, const char *name)
{
	const char **found;

	found = bsearch(&name, set->names, set->count, sizeof(char *),
					name_array_cmp);
	Assert(found != NULL);
	return found - set->names;
}

/*
 * Read the (names, resources) arrays of etcd_lock_and_fence(text[],
 * text[]): resources[i] is fenced with the token of the lock on names[i].
 * Makes set the lock set of the names and returns the resources to fence,
 * sorted by bytes, each once, in *out.  Refuses arrays of different
 * lengths, and a resource paired with two different names (it can carry
 * one lock's token only).  Everything is checked before etcd is contacted.
 */
int
etcd_fenced_resources_of_arrays(ArrayType *names, ArrayType *resources,
								EtcdLockSet *set, EtcdFencedResource **out)
{
	int			n_names;
	int			n_res;
	bool		holder = true;
	char	  **name_elems = name_array_elements(names, NAME_ARRAY_LOCK_NAMES,
												 validate_lock_name, &holder,
												 &n_names);
	char	  **res_elems = name_array_elements(resources,
												NAME_ARRAY_RESOURCES,
												validate_resource, NULL,
												&n_res);
	EtcdFencedResource *fr;
	int			kept = 1;

	if (n_names != n_res)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("etcd lock name and fencing resource arrays must have the same number of elements"),
				 errdetail("The name array has %d elements and the resource array %d.",
						   n_names, n_res),
				 errhint("Each resource is fenced with the token of the lock named at the same position.")));

	fr = palloc(sizeof(EtcdFencedResource) * n_res);
	for (int i = 0; i < n_res; i++)
	{
		fr[i].resource = res_elems[i];
		fr[i].name = name_elems[i];
	}
	qsort(fr, n_res, sizeof(EtcdFencedResource), fenced_resource_cmp);
	for (int i = 1; i < n_res; i++)
	{
		if (strcmp(fr[i].resource, fr[kept - 1].resource) != 0)
			fr[kept++] = fr[i];
		else if (strcmp(fr[i].name, fr[kept - 1].name) != 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("fencing resource \"%s\" is paired with two etcd lock names",
							fr[i].resource),
					 errdetail("It is paired with \"%s\" and \"%s\"; a resource is fenced with the token of one lock.",
							   fr[kept - 1].name, fr[i].name)));
	}

	/* the name array is sorted now: fr keeps its own pointers */
	set_of_names(set, name_elems, n_names);
	for (int i = 0; i < kept; i++)
		fr[i].lock = set_index(set, fr[i].name);
	*out = fr;
	return kept;
}

/*
 * One etcd_lock_set_take call: what its steps and the cleanup after an
 * error share (lockfence_run_with_cleanup).
 */
typedef struct LockSetCall
{
	EtcdLockSet *set;
	int			ttl;
	long		wait_ms;		/* for all the locks; < 0: no limit */
	EtcdLockSetStep step;
	void	   *step_arg;
} LockSetCall;

/*
 * Release, after an error, every lock of the set this call holds (all
 * pending), newest first, each as a failed acquisition releases its lock,
 * within one cleanup budget in all (etcd_acquire_cleanup_budget_ms(): 50
 * ms after a cancel, so the interrupt takes effect at once however many
 * locks the set holds).  Locks left when the budget is spent are given
 * up: their keys go with their leases, at exit or with the TTL.  Never
 * raises.
 */
static void
lock_set_release_after_error(void *arg)
{
	EtcdLockSet *set = ((LockSetCall *) arg)->set;
	TimestampTz began = GetCurrentTimestamp();
	TimestampTz deadline;

	/*
	 * The lock whose acquisition failed released its own key first (see
	 * etcd_lock.c): that was the first part of the one budget.
	 */
	if (set->held < set->count && set->locks[set->held].release_began != 0)
		began = set->locks[set->held].release_began;
	deadline = TimestampTzPlusMilliseconds(began,
										   etcd_acquire_cleanup_budget_ms());
	while (set->held > 0)
	{
		EtcdLockResult *l = &set->locks[--set->held];
		long		left = wait_ms_until(deadline);

		/*
		 * Each release gets what is left, not a budget of its own; once it
		 * is spent, the rest are given up at once rather than left pending
		 * for the abort, whose release would take a second budget.
		 */
		if (left > 0)
			etcd_lock_release_after_error(l->lease, l->key, !l->fresh_lease,
										  left);
		else
			etcd_session_give_up(l->lease, l->key);
	}
	set->held = 0;
}

/*
 * Acquire every lock of the set, in order, within wait_ms in all (< 0: no
 * limit).  Run under lock_set_release_after_error.
 */
static void
lock_set_acquire(void *arg)
{
	LockSetCall *c = (LockSetCall *) arg;
	EtcdLockSet *set = c->set;
	TimestampTz deadline;
	LockManyPosition pos = {STEP_ACQUIRE, 0, set->count};
	ErrorContextCallback cb;

	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
										   Max(c->wait_ms, 0));
	cb.callback = lock_many_error_context;
	cb.arg = &pos;
	cb.previous = error_context_stack;
	error_context_stack = &cb;

	for (pos.index = 0; pos.index < set->count; pos.index++)
	{
		long		left = -1;

		/* each call's deadline counts from its own start */
		if (c->wait_ms >= 0)
			left = wait_ms_until(deadline);
		(void) etcd_lock_acquire(set->names[pos.index], c->ttl, left, false,
								 &set->locks[pos.index]);
		set->held = pos.index + 1;
	}
	error_context_stack = cb.previous;
}

/* the caller's step, while the locks are pending */
static void
lock_set_step(void *arg)
{
	LockSetCall *c = (LockSetCall *) arg;

	c->step(c->set, c->step_arg);
}

/*
 * Take every lock of the set, all or nothing: acquire them in order
 * within wait_ms in all, run step(set, arg) while they are still pending
 * (the caller's fences and result rows), then hand them all over to the
 * SQL caller, transaction-scoped if xact_scope, marked as fenced with (for
 * the commit-time check) if fenced.  If anything fails before the hand
 * over, every lock taken is released before the error propagates.
 */
void
etcd_lock_set_take(EtcdLockSet *set, int ttl, long wait_ms, bool xact_scope,
				   bool fenced, EtcdLockSetStep step, void *arg)
{
	LockSetCall c = {set, ttl, wait_ms, step, arg};

	lockfence_run_with_cleanup(lock_set_acquire, lock_set_release_after_error,
							   &c);
	lockfence_run_with_cleanup(lock_set_step, lock_set_release_after_error,
							   &c);

	for (int i = 0; i < set->count; i++)
	{
		etcd_lock_hand_over(&set->locks[i], xact_scope);
		if (fenced)
			etcd_session_lock_fenced(set->locks[i].key);
	}
}

/*
 * Fence each resource (in byte order) with the token of its lock, holder
 * the lock's key, in the current transaction.  Raises at the first
 * rejected one; the caller's error path releases the locks, and the
 * (sub)transaction abort undoes the fences made before it.
 */
void
etcd_lock_set_fence(EtcdLockSet *set, const EtcdFencedResource *fences,
					int n)
{
	LockManyPosition pos = {STEP_FENCE, 0, n};
	ErrorContextCallback cb;

	cb.callback = lock_many_error_context;
	cb.arg = &pos;
	cb.previous = error_context_stack;
	error_context_stack = &cb;
	for (pos.index = 0; pos.index < n; pos.index++)
	{
		EtcdLockResult *l = &set->locks[fences[pos.index].lock];

		(void) DirectFunctionCall3(lockfence_fence,
								   CStringGetTextDatum(fences[pos.index].resource),
								   Int64GetDatum(l->token),
								   CStringGetTextDatum(l->key));
	}
	error_context_stack = cb.previous;
}
