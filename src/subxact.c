/*-------------------------------------------------------------------------
 *
 * subxact.c
 *	  Run a step in an internal subtransaction kept only when it succeeds.
 *
 * A row-locking statement that finds the row updated since its snapshot
 * locks the newest version before re-checking its WHERE clause, and keeps
 * that lock when the re-check fails.  Steps that may be refused after such
 * a lock (a waiting fence check, a lease grant, renewal or release, a
 * multi-resource try_fence) therefore run in an internal subtransaction
 * that is rolled back when they do not succeed, so that the stray lock
 * does not outlive the call.
 *
 * IDENTIFICATION
 *	  src/subxact.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "utils/resowner.h"

#include "lockfence.h"

/*
 * Run step(arg) in an internal subtransaction.  When it returns true the
 * subtransaction's locks and changes pass to the caller; when it returns
 * false they are rolled back.  An error rolls the subtransaction back too,
 * then propagates.  Returns step's result.
 */
bool
lockfence_run_in_subxact(bool (*step) (void *arg), void *arg)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	volatile bool keep = false;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcxt);

	/* own PG_TRY (not error_cleanup.c): re-raises outside the subxact */
	PG_TRY();
	{
		keep = step(arg);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		/* Save the error, leave the subtransaction, re-raise outside. */
		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcxt);
		CurrentResourceOwner = oldowner;
		ReThrowError(edata);
	}
	PG_END_TRY();

	if (keep)
		ReleaseCurrentSubTransaction();
	else
		RollbackAndReleaseCurrentSubTransaction();
	MemoryContextSwitchTo(oldcxt);
	CurrentResourceOwner = oldowner;
	return keep;
}
