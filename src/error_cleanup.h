/*-------------------------------------------------------------------------
 *
 * error_cleanup.h
 *	  Run a step and, if it raises, a cleanup before the error propagates
 *	  (error_cleanup.c).
 *
 * IDENTIFICATION
 *	  src/error_cleanup.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_ERROR_CLEANUP_H
#define LOCKFENCE_ERROR_CLEANUP_H

/* a step of lockfence_run_with_cleanup: the body, or the cleanup */
typedef void (*LockfenceCleanupStep) (void *arg);

extern void lockfence_run_with_cleanup(LockfenceCleanupStep body,
									   LockfenceCleanupStep cleanup,
									   void *arg);

#endif							/* LOCKFENCE_ERROR_CLEANUP_H */
