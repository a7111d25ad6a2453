/*-------------------------------------------------------------------------
 *
 * etcd_sql.c
 *	  The SQL-callable functions lockfence.etcd_*: argument checks, result
 *	  rows, and handing an acquired lock over to the SQL caller.
 *
 * The lock protocol itself is in etcd_lock.c, the lease RPCs in
 * etcd_lease.c, the locks of one call taken all or nothing (also the
 * one-lock etcd_lock_and_fence) in etcd_lock_many.c.
 *
 * IDENTIFICATION
 *	  src/etcd_sql.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "error_cleanup.h"
#include "etcd.h"
#include "failover_guard.h"
#include "lockfence.h"
#include "wait_timeout.h"

PG_FUNCTION_INFO_V1(lockfence_etcd_lock);
PG_FUNCTION_INFO_V1(lockfence_etcd_try_lock);
PG_FUNCTION_INFO_V1(lockfence_etcd_unlock);
PG_FUNCTION_INFO_V1(lockfence_etcd_keepalive);
PG_FUNCTION_INFO_V1(lockfence_etcd_lock_and_fence);
PG_FUNCTION_INFO_V1(lockfence_etcd_lock_and_fence_many);
PG_FUNCTION_INFO_V1(lockfence_etcd_lock_many);

/*
 * Convert wait_timeout to milliseconds; -1 for NULL or no limit (wait
 * forever, see wait_timeout_usecs).
 */
static long
wait_timeout_ms(FunctionCallInfo fcinfo, int argno)
{
	int64		usecs;

	if (PG_ARGISNULL(argno))
		return -1;
	if (!wait_timeout_usecs(PG_GETARG_INTERVAL_P(argno), &usecs))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("wait_timeout must not be negative")));
	if (usecs == WAIT_TIMEOUT_FOREVER || usecs / 1000 > (int64) LONG_MAX / 2)
		return -1;
	/* rounded up: a wait_timeout never fires before it passed */
	return (long) ((usecs + 999) / 1000);
}

/* return_lock_row's step and its cleanup: the call and its lock */
typedef struct LockRow
{
	FunctionCallInfo fcinfo;
	EtcdLockResult *res;
} LockRow;

static void
put_lock_row(void *arg)
{
	LockRow    *r = (LockRow *) arg;
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) r->fcinfo->resultinfo;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	values[0] = CStringGetTextDatum(r->res->key);
	values[1] = Int64GetDatum(r->res->lease);
	values[2] = Int64GetDatum(r->res->token);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

static void
release_lock_of_row(void *arg)
{
	EtcdLockResult *res = ((LockRow *) arg)->res;

	etcd_lock_release_after_error(res->lease, res->key, !res->fresh_lease,
								  etcd_acquire_cleanup_budget_ms());
}

/*
 * Put the result row of etcd_lock / etcd_try_lock into the tuplestore
 * set up with InitMaterializedSRF, then hand the lock over; if that
 * fails, the lock is released.
 */
static void
return_lock_row(FunctionCallInfo fcinfo, EtcdLockResult *res, bool xact_scope)
{
	LockRow		r = {fcinfo, res};

	lockfence_run_with_cleanup(put_lock_row, release_lock_of_row, &r);
	etcd_lock_hand_over(res, xact_scope);
}

/*
 * Refuse a NULL argument argno, naming it as what.
 */
static void
require_arg(FunctionCallInfo fcinfo, int argno, const char *what)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what)));
}

/*
 * The scope argument (argument argno): true for 'transaction', false for
 * 'session'.  Without it (SQL of an older version installed), dflt.
 */
static bool
xact_scope_arg(FunctionCallInfo fcinfo, int argno, bool dflt)
{
	char	   *scope;

	if (PG_NARGS() <= argno)
		return dflt;
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("scope must not be null")));
	scope = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	if (strcmp(scope, "transaction") == 0)
		return true;
	if (strcmp(scope, "session") == 0)
		return false;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("invalid etcd lock scope \"%s\"", scope),
			 errhint("The scope is \"session\" or \"transaction\".")));
	return false;				/* not reached */
}

/*
 * The (name, ttl_seconds) arguments shared by etcd_lock and etcd_try_lock.
 */
static void
lock_args(FunctionCallInfo fcinfo, char **name, int *ttl)
{
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("name and ttl_seconds must not be null")));
	*name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	*ttl = PG_GETARG_INT32(1);
}

/*
 * lockfence.etcd_lock(name, ttl_seconds, wait_timeout, scope)
 *		-> TABLE(key, lease, token)
 *
 * Blocks until this session holds the named lock, keeping the waiting
 * lease alive.  Returns exactly one row.  A transaction-scoped lock is
 * released when the transaction that took it ends.
 */
Datum
lockfence_etcd_lock(PG_FUNCTION_ARGS)
{
	char	   *name;
	int			ttl;
	long		wait_ms;
	bool		xact_scope;
	EtcdLockResult res;

	lockfence_refuse_parallel_mode("lockfence.etcd_lock()");

	lock_args(fcinfo, &name, &ttl);
	wait_ms = wait_timeout_ms(fcinfo, 2);
	xact_scope = xact_scope_arg(fcinfo, 3, false);
	InitMaterializedSRF(fcinfo, 0);

	(void) etcd_lock_acquire(name, ttl, wait_ms, false, &res);
	return_lock_row(fcinfo, &res, xact_scope);
	return (Datum) 0;
}

/*
 * lockfence.etcd_try_lock(name, ttl_seconds, scope)
 *		-> TABLE(key, lease, token)
 *
 * One row when the lock was free and is now ours; no row (and nothing of
 * ours left in etcd) when someone else holds or waits for it.
 */
Datum
lockfence_etcd_try_lock(PG_FUNCTION_ARGS)
{
	char	   *name;
	int			ttl;
	EtcdLockResult res;
	bool		got;
	bool		xact_scope;

	lockfence_refuse_parallel_mode("lockfence.etcd_try_lock()");

	lock_args(fcinfo, &name, &ttl);
	xact_scope = xact_scope_arg(fcinfo, 2, false);
	InitMaterializedSRF(fcinfo, 0);

	got = etcd_lock_acquire(name, ttl, 0, true, &res);
	if (got)
		return_lock_row(fcinfo, &res, xact_scope);
	return (Datum) 0;
}

/*
 * lockfence.etcd_unlock(key, force DEFAULT false) -> boolean
 *
 * Releases a lock: deletes its key and revokes its lease.  Returns false,
 * with a NOTICE, when the key was already gone.
 *
 * Only lock keys are released, "<name>/<lease hex>" attached to the lease
 * their name ends in (checked by etcd in the same transaction as the
 * deletion): revoking a lease deletes every key on it, so an arbitrary
 * key (application configuration, say) must not be handed to it by
 * mistake.  force => true deletes any key and revokes its lease.  Both
 * requests are idempotent, so etcd_call retries them on the other
 * endpoints within lockfence.etcd_request_timeout.  (Installed 1.1 SQL
 * calls this with the key only: force is then false.)
 */
Datum
lockfence_etcd_unlock(PG_FUNCTION_ARGS)
{
	char	   *key = text_to_cstring(PG_GETARG_TEXT_PP(0));
	bool		force = PG_NARGS() > 1 ? PG_GETARG_BOOL(1) : false;

	lockfence_refuse_parallel_mode("lockfence.etcd_unlock()");

	PG_RETURN_BOOL(etcd_unlock_key(key, force));
}

/* etcd_lock_and_fence's work while its locks are pending */
typedef struct LockAndFence
{
	const EtcdFencedResource *fences;
	int			n;
	FunctionCallInfo fcinfo;	/* for result rows; NULL: none */
} LockAndFence;

/*
 * Fence each resource with the token of its lock; then, for the array
 * form, put one result row per resource (resource, name, key, lease,
 * token) into the tuplestore set up with InitMaterializedSRF.
 */
static void
lock_and_fence_step(EtcdLockSet *set, void *arg)
{
	LockAndFence *lf = (LockAndFence *) arg;
	ReturnSetInfo *rsinfo;

	etcd_lock_set_fence(set, lf->fences, lf->n);
	if (lf->fcinfo == NULL)
		return;
	rsinfo = (ReturnSetInfo *) lf->fcinfo->resultinfo;
	for (int i = 0; i < lf->n; i++)
	{
		EtcdLockResult *l = &set->locks[lf->fences[i].lock];
		Datum		values[5];
		bool		nulls[5] = {false, false, false, false, false};

		values[0] = CStringGetTextDatum(lf->fences[i].resource);
		values[1] = CStringGetTextDatum(lf->fences[i].name);
		values[2] = CStringGetTextDatum(l->key);
		values[3] = Int64GetDatum(l->lease);
		values[4] = Int64GetDatum(l->token);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values,
							 nulls);
	}
}

/*
 * lockfence.etcd_lock_and_fence(name, resource, ttl_seconds, wait_timeout,
 *							  scope DEFAULT 'transaction') -> bigint
 *
 * etcd_lock, then lockfence.fence(resource, token, holder => key) in the
 * current transaction; returns the token.  Every argument is checked
 * before etcd is contacted.  Until the fence accepted the token the lock
 * is pending: any error (a rejected token, a cancel or statement timeout
 * while the fence waits for another transaction's fence row, ...)
 * releases it before the error propagates, since the caller never learns
 * the key.  The lock set of one name (etcd_lock_many.c) does all that, as
 * for the array form.
 */
Datum
lockfence_etcd_lock_and_fence(PG_FUNCTION_ARGS)
{
	char	   *name;
	char	   *resource;
	int			ttl;
	long		wait_ms;
	bool		xact_scope;
	EtcdLockSet set;
	EtcdFencedResource fence;
	LockAndFence lf = {&fence, 1, NULL};

	lockfence_refuse_parallel_mode("lockfence.etcd_lock_and_fence()");

	if (PG_ARGISNULL(0) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("name and ttl_seconds must not be null")));
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("fencing resource must not be null")));
	name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	resource = text_to_cstring(PG_GETARG_TEXT_PP(1));
	ttl = PG_GETARG_INT32(2);
	/* the holder's limit first: 22001 for any name too long, as documented */
	etcd_lock_check_holder_name(name);
	etcd_lock_check_args(name, ttl);
	lockfence_validate_resource(resource);
	wait_ms = wait_timeout_ms(fcinfo, 3);
	/* 1.2 SQL has scope, defaulting to 'transaction'; older SQL had none */
	xact_scope = xact_scope_arg(fcinfo, 4, false);

	lockfence_failover_guard();
	etcd_lock_set_of_name(&set, name);
	fence.resource = resource;
	fence.name = set.names[0];
	fence.lock = 0;
	etcd_lock_set_take(&set, ttl, wait_ms, xact_scope, true,
					   lock_and_fence_step, &lf);
	PG_RETURN_INT64(set.locks[0].token);
}

/*
 * lockfence.etcd_lock_and_fence(names text[], resources text[], ttl_seconds,
 *							  wait_timeout, scope DEFAULT 'transaction')
 *		-> TABLE(resource, name, key, lease, token)
 *
 * Locks every distinct name in byte order, then fences resources[i] with
 * the token of the lock on names[i], resources in byte order; all or
 * nothing: any error releases every lock the call took and undoes its
 * fences.  wait_timeout bounds the whole call.  One row per distinct
 * resource, in byte order.  Every lock is confirmed at commit.
 */
Datum
lockfence_etcd_lock_and_fence_many(PG_FUNCTION_ARGS)
{
	EtcdLockSet set;
	EtcdFencedResource *fences;
	LockAndFence lf;
	int			ttl;
	long		wait_ms;
	bool		xact_scope;

	lockfence_refuse_parallel_mode("lockfence.etcd_lock_and_fence()");

	require_arg(fcinfo, 0, "etcd lock name array");
	require_arg(fcinfo, 1, "fencing resource array");
	require_arg(fcinfo, 2, "ttl_seconds");
	ttl = PG_GETARG_INT32(2);
	lf.n = etcd_fenced_resources_of_arrays(PG_GETARG_ARRAYTYPE_P(0),
										   PG_GETARG_ARRAYTYPE_P(1),
										   &set, &fences);
	lf.fences = fences;
	/* the names are valid by now: this checks ttl_seconds */
	etcd_lock_check_args(set.names[0], ttl);
	wait_ms = wait_timeout_ms(fcinfo, 3);
	xact_scope = xact_scope_arg(fcinfo, 4, true);
	lf.fcinfo = fcinfo;
	lockfence_failover_guard();
	InitMaterializedSRF(fcinfo, 0);

	etcd_lock_set_take(&set, ttl, wait_ms, xact_scope, true,
					   lock_and_fence_step, &lf);
	return (Datum) 0;
}

/*
 * etcd_lock_many's work while its locks are pending: one result row per
 * lock (name, key, lease, token), in byte order of the names.
 */
static void
lock_many_rows(EtcdLockSet *set, void *arg)
{
	FunctionCallInfo fcinfo = (FunctionCallInfo) arg;
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	for (int i = 0; i < set->count; i++)
	{
		Datum		values[4];
		bool		nulls[4] = {false, false, false, false};

		values[0] = CStringGetTextDatum(set->names[i]);
		values[1] = CStringGetTextDatum(set->locks[i].key);
		values[2] = Int64GetDatum(set->locks[i].lease);
		values[3] = Int64GetDatum(set->locks[i].token);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values,
							 nulls);
	}
}

/*
 * lockfence.etcd_lock_many(names text[], ttl_seconds, wait_timeout,
 *						 scope DEFAULT 'session')
 *		-> TABLE(name, key, lease, token)
 *
 * Acquires the lock on every distinct name, in byte order, on the session
 * lease of ttl_seconds, waiting at most wait_timeout in all; one row per
 * name.  All or nothing: if an acquisition fails, times out or is
 * cancelled, every lock the call took is released before the error
 * propagates.  scope as for etcd_lock.
 */
Datum
lockfence_etcd_lock_many(PG_FUNCTION_ARGS)
{
	EtcdLockSet set;
	int			ttl;
	long		wait_ms;
	bool		xact_scope;

	lockfence_refuse_parallel_mode("lockfence.etcd_lock_many()");

	require_arg(fcinfo, 0, "etcd lock name array");
	require_arg(fcinfo, 1, "ttl_seconds");
	ttl = PG_GETARG_INT32(1);
	etcd_lock_set_of_array(&set, PG_GETARG_ARRAYTYPE_P(0));
	/* the names are valid by now: this checks ttl_seconds */
	etcd_lock_check_args(set.names[0], ttl);
	wait_ms = wait_timeout_ms(fcinfo, 2);
	xact_scope = xact_scope_arg(fcinfo, 3, false);
	InitMaterializedSRF(fcinfo, 0);

	etcd_lock_set_take(&set, ttl, wait_ms, xact_scope, false,
					   lock_many_rows, fcinfo);
	return (Datum) 0;
}

/*
 * lockfence.etcd_keepalive(lease) -> bigint
 *
 * Renews a lease once and returns its remaining TTL in seconds; LF003 if
 * the lease is gone.
 */
Datum
lockfence_etcd_keepalive(PG_FUNCTION_ARGS)
{
	int64		lease = PG_GETARG_INT64(0);
	int64		ttl = 0;

	lockfence_refuse_parallel_mode("lockfence.etcd_keepalive()");

	if (lease <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid etcd lease ID " INT64_FORMAT, lease)));
	if (!etcd_session_keepalive(lease, &ttl))
	{
		etcd_session_untrack(lease);
		ereport(ERROR,
				(errcode(ERRCODE_LOCKFENCE_LOCK_LOST),
				 errmsg("etcd lease " INT64_FORMAT " has expired or was revoked",
						lease),
				 errdetail("Locks held under this lease are lost."),
				 errhint("Acquire the lock again.")));
	}
	PG_RETURN_INT64(ttl);
}

/*
 * Module initialization for the etcd functions: called from _PG_init.
 */
void
lockfence_etcd_init(void)
{
	etcd_guc_init();
	etcd_commit_check_init();
	etcd_session_init();
	lockfence_on_fence_accepted(etcd_session_fence_accepted);
}
