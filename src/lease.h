/*-------------------------------------------------------------------------
 *
 * lease.h
 *	  Lease locks kept in the fence table (lease.c, lease_wait.c).
 *
 * IDENTIFICATION
 *	  src/lease.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_LEASE_H
#define LOCKFENCE_LEASE_H

#include "fence_fastpath.h"
#include "lockfence.h"

/*
 * Without shared_preload_libraries, a waiter looks at the lease this often
 * (documented in docs/leases.md).
 */
#define LEASE_POLL_INTERVAL_MS	10

/*
 * With it, a waiter still looks at least this often: a release committed
 * by COMMIT PREPARED is not announced.
 */
#define LEASE_MAX_SLEEP_MS		1000

/* A lease operation, as lease_decide judges it. */
typedef enum LeaseOp
{
	LEASE_OP_GRANT,
	LEASE_OP_RENEW,
	LEASE_OP_RELEASE
} LeaseOp;

/* What lease_decide found. */
typedef enum LeaseVerdict
{
	LEASE_WRITE,				/* the operation applies: write *newrow */
	LEASE_HELD,					/* grant: an unexpired lease, wait for it */
	LEASE_TOKENS_EXHAUSTED,		/* grant: the token is at its maximum */
	LEASE_TAKEN_OVER,			/* renew, release: a higher token since */
	LEASE_RELEASED,				/* renew, release: the lease was released */
	LEASE_BELOW_FLOOR,			/* renew, release: (1.15) below the failover
								 * floor, which ended it */
	LEASE_EXPIRED,				/* renew, release: the lease expired */
	LEASE_NOT_HELD				/* renew, release: no lease of the token */
} LeaseVerdict;

/* lease_decide.c: the one judgment of a lease, for both paths */
extern LeaseVerdict lease_decide(const char *name, LeaseOp op,
								 const FenceRow *row, int64 token,
								 const char *holder, Interval *ttl,
								 TimestampTz now, FenceRow *newrow);
extern void lease_check_ttl(const char *func, const char *name,
							Interval *ttl);

/* lease_fastpath.c: uncontended operations without SPI */
extern bool lease_fastpath_grant(const char *name, const char *holder,
								 Interval *ttl, FenceRow *prev, FenceRow *row);
extern bool lease_fastpath_renew(const char *name, int64 token, Interval *ttl,
								 FenceRow *row);
extern bool lease_fastpath_release(const char *name, int64 token,
								   FenceRow *row);

/* lease_wait.c */
extern void lease_wait_prepare(const char *name);
extern void lease_wait_sleep(long timeout_ms);
extern void lease_wait_done(void);
extern void lease_wait_check_granted(void);
extern void lease_wait_announce_at_commit(const char *name);

#endif							/* LOCKFENCE_LEASE_H */
