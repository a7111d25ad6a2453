/*-------------------------------------------------------------------------
 *
 * error_cleanup.c
 *	  The error handler that undoes a step's partial work: run the step,
 *	  and if it raises, switch back to the caller's memory context, run a
 *	  cleanup and re-raise the same error.
 *
 * The etcd calls release what a failed acquisition or unlock left in
 * etcd this way, and the lease calls count a failed acquisition.  Written
 * once here rather than as a PG_TRY block at each site.  Handlers that do
 * something else (roll back a subtransaction, swallow the error, catch
 * one SQLSTATE) keep their own PG_TRY, each saying why.
 *
 * The bottom of the call graph: it calls no other file of lockfence
 * (docs/internals.md).
 *
 * IDENTIFICATION
 *	  src/error_cleanup.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "error_cleanup.h"

/*
 * Run body(arg).  If it raises, run cleanup(arg) in the memory context
 * current at the call (the error left CurrentMemoryContext in
 * ErrorContext or wherever it was raised), then re-raise the error.
 *
 * What body changes and cleanup reads must live in *arg, not in locals of
 * the caller's that body cannot see: body and cleanup share nothing else.
 * A cleanup that raises replaces the original error with its own, as a
 * PG_CATCH block's would; the cleanups in use are quiet.
 */
void
lockfence_run_with_cleanup(LockfenceCleanupStep body,
						   LockfenceCleanupStep cleanup, void *arg)
{
	MemoryContext cxt = CurrentMemoryContext;

	PG_TRY();
	{
		body(arg);
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		cleanup(arg);
		PG_RE_THROW();
	}
	PG_END_TRY();
}
