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

/* lease_fastpath.c: uncontended operations without SPI */
extern bool lease_fastpath_grant(const char *name, const char *holder,
								 Interval *ttl, FenceRow *prev, FenceRow *row);
extern bool lease_fastpath_renew(const char *name, int64 token, Interval *ttl,
								 FenceRow *row);
extern bool lease_fastpath_release(const char *name, int64 token,
								   FenceRow *row);

/* lease_wait.c */
extern bool lease_wait_announced(void);
extern void lease_wait_prepare(const char *name);
extern void lease_wait_sleep(long timeout_ms);
extern void lease_wait_done(void);
extern void lease_wait_announce_at_commit(const char *name);

#endif							/* LOCKFENCE_LEASE_H */
