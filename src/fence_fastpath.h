/*-------------------------------------------------------------------------
 *
 * fence_fastpath.h
 *	  The fence row as the heap fast path (fence_fastpath.c,
 *	  lease_fastpath.c), the statements' reader (fence_store.c) and the
 *	  rules (fence_decide.c, lease_decide.c) see it, and the table shape
 *	  the fast path requires (fence_shape.c).
 *
 * IDENTIFICATION
 *	  src/fence_fastpath.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_FENCE_FASTPATH_H
#define LOCKFENCE_FENCE_FASTPATH_H

#include "utils/relcache.h"

#include "lockfence.h"

/*
 * A fence row's columns as fence_fastpath_update reads and writes them (the
 * resource never changes).  Pointers are palloc'd copies.
 */
typedef struct FenceRow
{
	int64		token;
	TimestampTz accepted_at;
	char	   *holder;			/* NULL: none */
	bool		leased;			/* lease_expires_at is not NULL */
	TimestampTz lease_expires_at;	/* if leased (-infinity: released) */
	Interval   *lease_ttl;		/* NULL: none */
} FenceRow;

/*
 * Decide from a fence row as found whether to update it: fill *newrow (a
 * copy of *row on entry) and return true, or return false to leave the row
 * alone.
 */
typedef bool (*FenceRowEdit) (const FenceRow *row, FenceRow *newrow,
							  void *arg);

/* What fence_fastpath_read found. */
typedef enum FenceRowRead
{
	FENCE_ROW_FOUND,
	FENCE_ROW_ABSENT,			/* no row for the resource */
	FENCE_ROW_UNREADABLE		/* not here: read it with a statement */
} FenceRowRead;

/* fence_fastpath.c: fence rows read and written without SPI */
extern void fence_fastpath_init(void);
extern FenceRowRead fence_fastpath_read(const char *resource, bool latest,
										FenceRow *row);
extern bool fence_fastpath_lock_lower(const char *resource, int64 token);
extern bool fence_fastpath_update(const char *resource, FenceRowEdit edit,
								  void *arg, FenceRow *row, FenceRow *newrow);

/* What a fence check does next, as fence_decide judges it. */
typedef enum FenceAction
{
	FENCE_ACTION_SHARE,			/* accept an equal token: ShareLock */
	FENCE_ACTION_ADVANCE,		/* accept a higher token: update the row */
	FENCE_ACTION_INSERT,		/* accept a first token: insert the row */
	FENCE_ACTION_REFUSE			/* outcome->verdict says why */
} FenceAction;

/* fence_decide.c: the one judgment of a fence check, for every path */
extern FenceAction fence_decide(const FenceRow *row, int64 token,
								const char *holder, bool must_advance,
								FenceOutcome *outcome);

/* fence_shape.c: is lockfence.fences as the install scripts make it? */
extern const char *fences_table_problem(Relation rel);
extern uint64 fences_table_invalidations(void);

#endif							/* LOCKFENCE_FENCE_FASTPATH_H */
