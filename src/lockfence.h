/*-------------------------------------------------------------------------
 *
 * lockfence.h
 *	  The public fence API: SQLSTATEs, limits, verdicts, and what the SQL
 *	  functions and the trigger call (the check, the store, the cache).
 *	  The fence row as the fast path and the rules see it is in
 *	  fence_fastpath.h.
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
	int64		highest;		/* highest token accepted, after the check; for
								 * a token below the failover floor, the floor */
	bool		below_floor;	/* stale for being below the failover floor */
	char	   *highest_holder; /* its holder, or NULL when unknown */
	bool		leased;			/* highest was granted as a lease (lease.c) */
	TimestampTz lease_expires_at;	/* if leased: its expiry (-infinity when
									 * released) */
} FenceOutcome;

/* validate.c */
extern void lockfence_validate_resource(const char *resource);
extern void lockfence_validate_token(int64 token);
extern void lockfence_validate_holder(const char *holder);
extern void lockfence_refuse_parallel_mode(const char *function);

/* fence.c */
extern FenceVerdict lockfence_check(const char *resource, int64 token,
									const char *holder, bool must_advance,
									const char *funcname,
									FenceOutcome *outcome);
extern void lockfence_report_rejection(const char *resource, int64 token,
									   const char *holder,
									   const FenceOutcome *outcome);
extern bool fence_cache_covers(const char *resource, int64 token,
							   const char *holder);
/* fence_decide.c */
extern bool fence_holders_conflict(const char *recorded,
								   const char *presented);

/* fence_store.c: the fence table, read and written through SPI */
extern void fence_store_check(const char *resource, int64 token,
							  const char *holder, bool must_advance,
							  const char *funcname, FenceOutcome *outcome);
extern bool fence_store_current(const char *resource, int64 *token);
struct FenceRow;
extern bool fence_store_read_latest(const char *resource,
									struct FenceRow *row);
extern bool fence_store_delete(const char *resource);

/* fence.c: who is told of an accepted fence (its holder, or NULL) */
typedef void (*FenceAcceptedCallback) (const char *holder);
extern void lockfence_on_fence_accepted(FenceAcceptedCallback callback);

/* subxact.c: a step whose row locks are kept only when it succeeds */
extern bool lockfence_run_in_subxact(bool (*step) (void *arg), void *arg);

/* fence_cache.c: tokens this transaction has already fenced */
extern void fence_cache_init(void);
extern bool fence_cache_lookup(const char *resource, int64 *token,
							   const char **holder);
extern void fence_cache_remember(const char *resource, int64 token,
								 const char *holder);
extern void fence_cache_forget(const char *resource);
extern uint64 fence_cache_generation(void);

/* lease_wait.c: wake-ups of lease waiters (shared memory if preloaded) */
extern void lease_wait_init(void);

/* etcd_lock.c: etcd lock functions (GUCs, exit callback) */
extern void lockfence_etcd_init(void);

#endif							/* LOCKFENCE_H */
