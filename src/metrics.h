/*-------------------------------------------------------------------------
 *
 * metrics.h
 *	  Operational metrics and rejection logging of the lockfence extension.
 *
 * The counters live in shared memory, which exists only when the library
 * is in shared_preload_libraries.  Every function below may be called in
 * any case: without preloading the counting functions do nothing (the
 * rejection log still works), and only the SQL functions that read the
 * metrics raise an error.
 *
 * The lockfence_metrics_etcd_* functions only add to atomics: they take no
 * lock, allocate nothing and never raise, so they may be called anywhere
 * in a backend (even in a critical section or while cleaning up after an
 * error), but, per the project's rule, not from inside a libcurl callback.
 * The rejection functions also write the rejection log (and the missing
 * token one reads the fence table for it), so they belong where an error
 * may be raised: just before the rejection's own ereport.
 *
 * IDENTIFICATION
 *	  src/metrics.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_METRICS_H
#define LOCKFENCE_METRICS_H

#include "lockfence.h"

/* Number of resources whose rejections are counted one by one. */
#define LOCKFENCE_METRICS_TOP_RESOURCES	64

/* Called from _PG_init: the GUC, and the shared memory hooks if preloaded. */
extern void lockfence_metrics_init(void);

/* fence.c: one call per check lockfence_check() answers */
extern void lockfence_metrics_fence_accepted(void);
extern void lockfence_metrics_fence_rejected(const char *resource,
											 int64 token, const char *holder,
											 const FenceOutcome *outcome);

/* fence_trigger.c */
extern void lockfence_metrics_missing_token(const char *relname,
											const char *resource);
extern void lockfence_metrics_proceeded_without_lock(const char *relname);

/*
 * For the etcd lock client, once per event:
 *
 * lockfence_metrics_etcd_acquired(seconds): a lock was granted, seconds
 *	  after the acquisition began (waiting for the lock included).
 * lockfence_metrics_etcd_acquire_failed(): an acquisition ended in an
 *	  error (etcd unreachable or refusing, wait timeout, cancellation).  A
 *	  try_lock that finds the lock taken is contention, not an error: it
 *	  calls neither function.
 * lockfence_metrics_etcd_released(held_seconds): a lock acquired through
 *	  lockfence_metrics_etcd_acquired ended (released, expired or lost),
 *	  held_seconds after it was granted.
 */
extern void lockfence_metrics_etcd_acquired(double seconds);
extern void lockfence_metrics_etcd_acquire_failed(void);
extern void lockfence_metrics_etcd_released(double held_seconds);

/* The same for leases (lease.c), as separate lease_* series. */
extern void lockfence_metrics_lease_acquired(double seconds);
extern void lockfence_metrics_lease_acquire_failed(void);
extern void lockfence_metrics_lease_ended(double held_seconds, bool expired);

#endif							/* LOCKFENCE_METRICS_H */
