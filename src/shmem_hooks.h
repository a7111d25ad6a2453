/*-------------------------------------------------------------------------
 *
 * shmem_hooks.h
 *	  The library's shared memory: one place in PostgreSQL's hook chains
 *	  (shmem_hooks.c), and each module's part, which shmem_hooks.c calls.
 *
 * IDENTIFICATION
 *	  src/shmem_hooks.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_SHMEM_HOOKS_H
#define LOCKFENCE_SHMEM_HOOKS_H

/* shmem_hooks.c: called from _PG_init */
extern void lockfence_shmem_init(void);

/* metrics.c: the counters and histograms, and their LWLock */
extern void lockfence_metrics_shmem_request(void);
extern void lockfence_metrics_shmem_startup(void);

/* lease_wait.c: the condition variables lease waiters sleep on */
extern void lease_wait_shmem_request(void);
extern void lease_wait_shmem_startup(void);

#endif							/* LOCKFENCE_SHMEM_HOOKS_H */
