/*-------------------------------------------------------------------------
 *
 * fenced_token.c
 *	  lockfence.fenced_token(): the token this transaction fenced a
 *	  resource with, read from the per-transaction fence cache.
 *
 * IDENTIFICATION
 *	  src/fenced_token.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/parallel.h"
#include "fmgr.h"
#include "utils/builtins.h"

#include "lockfence.h"

PG_FUNCTION_INFO_V1(lockfence_fenced_token);

/*
 * lockfence.fenced_token(resource text)
 *
 * The token this transaction fenced resource with (lockfence.fence()), or
 * NULL when it has not: what a write without a token of its own would be
 * fenced with.  A name that could not be fenced is refused as fence() would.
 */
Datum
lockfence_fenced_token(PG_FUNCTION_ARGS)
{
	char	   *resource = text_to_cstring(PG_GETARG_TEXT_PP(0));
	int64		token;
	const char *holder;

	/* the cache is the leader's: a worker's is empty, and would say NULL */
	if (IsParallelWorker())
		lockfence_refuse_parallel_mode("lockfence.fenced_token()");
	lockfence_validate_resource(resource);
	if (!fence_cache_lookup(resource, &token, &holder))
		PG_RETURN_NULL();
	PG_RETURN_INT64(token);
}
