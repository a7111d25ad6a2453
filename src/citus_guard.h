/*-------------------------------------------------------------------------
 *
 * citus_guard.h
 *	  Fail closed where lockfence cannot guarantee the fence on Citus
 *	  (citus_guard.c).
 *
 * IDENTIFICATION
 *	  src/citus_guard.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_CITUS_GUARD_H
#define LOCKFENCE_CITUS_GUARD_H

#include "utils/relcache.h"

/*
 * Raise feature_not_supported when rel is a Citus table (distributed,
 * reference or Citus-managed local, listed in pg_dist_partition) or a shard
 * of one (listed in pg_dist_shard): its rows are not beside the fences that
 * lockfence.fence() writes.  Costs one test of a cached flag on a server
 * without Citus.
 */
extern void lockfence_citus_guard_relation(Relation rel);

/*
 * Raise feature_not_supported when lockfence.fences itself is a Citus
 * table: lockfence reads and writes it on this node directly, where rows
 * distributed by Citus cannot see it.  Costs one test of a cached flag in
 * the steady state.
 */
extern void lockfence_citus_guard_fences(void);

#endif							/* LOCKFENCE_CITUS_GUARD_H */
