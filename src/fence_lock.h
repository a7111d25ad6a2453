/*-------------------------------------------------------------------------
 *
 * fence_lock.h
 *	  The heavyweight lock on a fenced resource (fence_lock.c).
 *
 * IDENTIFICATION
 *	  src/fence_lock.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_FENCE_LOCK_H
#define LOCKFENCE_FENCE_LOCK_H

#include "storage/lockdefs.h"

/*
 * The fourth field of the advisory lock tag (pg_locks.objsubid) of a
 * resource lock: pg_advisory_lock() uses 1 and 2, so users' advisory locks
 * never collide with these.  'L' 'F' in ASCII.
 */
#define LOCKFENCE_LOCKTAG_FIELD4	0x4C46

extern bool fence_lock_acquire(const char *resource, LOCKMODE mode,
							   bool wait);
extern void fence_lock_release(const char *resource, LOCKMODE mode);
extern bool fence_lock_held(const char *resource, LOCKMODE mode);

#endif							/* LOCKFENCE_FENCE_LOCK_H */
