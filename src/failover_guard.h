/*-------------------------------------------------------------------------
 *
 * failover_guard.h
 *	  Fail closed after a promotion until the fence floor is raised
 *	  (failover_guard.c).
 *
 * IDENTIFICATION
 *	  src/failover_guard.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_FAILOVER_GUARD_H
#define LOCKFENCE_FAILOVER_GUARD_H

#include "lockfence.h"

/*
 * A fenced write or lease operation on a server whose fences were recorded
 * by another server or timeline (a promoted standby, a restored backup or
 * dump, pg_upgrade) before the floor was raised or the promotion accepted.
 */
#define ERRCODE_LOCKFENCE_FLOOR_REQUIRED	MAKE_SQLSTATE('L','F','0','0','4')

/*
 * Raise LF004 unless this server may write fences: not promoted since the
 * fences were recorded, or the floor raised since.  Does nothing during
 * recovery (nothing can be written there).  Costs two comparisons in the
 * steady state.
 */
extern void lockfence_failover_guard(void);

#endif							/* LOCKFENCE_FAILOVER_GUARD_H */
