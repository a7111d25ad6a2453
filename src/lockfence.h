/*-------------------------------------------------------------------------
 *
 * lockfence.h
 *	  Declarations shared by the modules of the lockfence extension.
 *
 * IDENTIFICATION
 *	  src/lockfence.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_H
#define LOCKFENCE_H

#include "postgres.h"

#include "compat.h"
#include "datatype/timestamp.h"
#include "utils/relcache.h"

/*
 * The extension's own SQLSTATEs, class LF.  Class LF is outside the ranges
 * the SQL standard and PostgreSQL use, and outside class 40, so drivers do
 * not retry a rejected write on their own: a lost lock must be acquired
 * again, and retrying with the same token can never succeed.
 */
#define ERRCODE_LOCKFENCE_STALE_TOKEN		MAKE_SQLSTATE('L','F','0','0','1')
#define ERRCODE_LOCKFENCE_MISSING_TOKEN		MAKE_SQLSTATE('L','F','0','0','2')
#define ERRCODE_LOCKFENCE_LOCK_LOST			MAKE_SQLSTATE('L','F','0','0','3')

/* Longest resource name accepted, in bytes (documented in README.md). */
#define LOCKFENCE_MAX_RESOURCE_BYTES	255

/* Longest holder name accepted, in bytes: the same limit as resources. */
#define LOCKFENCE_MAX_HOLDER_BYTES		255

/* Outcome of checking a token against the recorded fence. */
typedef enum FenceVerdict
{
	FENCE_ACCEPTED,				/* token >= highest, holder compatible */
	FENCE_STALE,				/* token < highest accepted */
	FENCE_HOLDER_CONFLICT,		/* token == highest, other holder */
	FENCE_NOT_ADVANCED,			/* token == highest, but an advance was
								 * required (a row token not fenced by this
								 * transaction may be a copy) */
	FENCE_LEASE_LOST			/* token == highest, a lease token whose
								 * lease expired or was released */
} FenceVerdict;

/* What the fence table said about a check; filled for every verdict. */
typedef struct FenceOutcome
{
	FenceVerdict verdict;
	int64		highest;		/* highest token accepted, after the check */
	char	   *highest_holder; /* its holder, or NULL when unknown */
	bool		leased;			/* highest was granted as a lease (lease.c) */
	TimestampTz lease_expires_at;	/* if leased: its expiry (-infinity when
									 * released) */
} FenceOutcome;

/* check.c: deployment safeguards */
extern void lockfence_check_init(void);

/* validate.c */
extern void lockfence_validate_resource(const char *resource);
extern void lockfence_validate_token(int64 token);
extern void lockfence_validate_holder(const char *holder);

/* fence.c */
extern FenceVerdict lockfence_check(const char *resource, int64 token,
									const char *holder, bool must_advance,
									FenceOutcome *outcome);
extern void lockfence_report_rejection(const char *resource, int64 token,
									   const char *holder,
									   const FenceOutcome *outcome);
extern bool fence_cache_covers(const char *resource, int64 token,
							   const char *holder);

/* fence_store.c: the fence table, read and written through SPI */
extern void fence_store_check(const char *resource, int64 token,
							  const char *holder, bool must_advance,
							  FenceOutcome *outcome);
extern bool fence_store_current(const char *resource, int64 *token);
extern bool fence_store_delete(const char *resource);

/* fence.c: who is told of an accepted fence (its holder, or NULL) */
typedef void (*FenceAcceptedCallback) (const char *holder);
extern void lockfence_on_fence_accepted(FenceAcceptedCallback callback);

/* subxact.c: a step whose row locks are kept only when it succeeds */
extern bool lockfence_run_in_subxact(bool (*step) (void *arg), void *arg);

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

/* fence_cache.c: tokens this transaction has already fenced */
extern void fence_cache_init(void);
extern bool fence_cache_lookup(const char *resource, int64 *token,
							   const char **holder);
extern void fence_cache_remember(const char *resource, int64 token,
								 const char *holder);
extern void fence_cache_forget(const char *resource);
extern void fence_cache_forget_all(void);

/* lease_wait.c: wake-ups of lease waiters (shared memory if preloaded) */
extern void lease_wait_init(void);

/* etcd_lock.c: etcd lock functions (GUCs, exit callback) */
extern void lockfence_etcd_init(void);

#endif							/* LOCKFENCE_H */
