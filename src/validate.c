/*-------------------------------------------------------------------------
 *
 * validate.c
 *	  Validation of the arguments every fence, lease and etcd lock function
 *	  shares: resource names, tokens and holder names; and of the context
 *	  they are called in.
 *
 * The bottom of the call graph: it calls no other file of lockfence, so
 * that any file may check its arguments (docs/internals.md).
 *
 * IDENTIFICATION
 *	  src/validate.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"

#include "lockfence.h"

/*
 * Reject an empty or over-long resource name.
 */
void
lockfence_validate_resource(const char *resource)
{
	size_t		len = strlen(resource);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("fencing resource name must not be empty")));
	if (len > LOCKFENCE_MAX_RESOURCE_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("fencing resource name is too long"),
				 errdetail("The name is %zu bytes long; the limit is %d bytes.",
						   len, LOCKFENCE_MAX_RESOURCE_BYTES)));
}

/*
 * Reject an over-long holder name: holders are echoed in errors and in the
 * rejection log, and stored in the fence table.
 */
void
lockfence_validate_holder(const char *holder)
{
	size_t		len = strlen(holder);

	if (len > LOCKFENCE_MAX_HOLDER_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("fencing holder name is too long"),
				 errdetail("The name is %zu bytes long; the limit is %d bytes.",
						   len, LOCKFENCE_MAX_HOLDER_BYTES)));
}

/*
 * Reject a negative token: lock services hand out non-negative ones, and a
 * negative token is a sign of a bug in the caller.
 */
void
lockfence_validate_token(int64 token)
{
	if (token < 0)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("fencing token must not be negative"),
				 errdetail("The token presented was " INT64_FORMAT ".", token)));
}

/*
 * Refuse to run during a parallel operation.  Every function that fences,
 * takes a lease or an etcd lock is declared PARALLEL UNSAFE, so only a
 * caller's own function wrongly marked PARALLEL SAFE or RESTRICTED gets
 * here in parallel mode.  Without this check the call fails deep inside
 * with an internal error (a snapshot it may not take), or would fence in a
 * worker's cache and take an etcd lock on a worker's session, both gone
 * when the worker exits.  What PostgreSQL says for its own commands
 * (PreventCommandIfParallelMode), with the fix in a hint.
 */
void
lockfence_refuse_parallel_mode(const char *function)
{
	if (IsInParallelMode())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("cannot execute %s during a parallel operation",
						function),
				 errhint("Mark the function that calls it PARALLEL UNSAFE.")));
}
