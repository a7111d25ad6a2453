/*-------------------------------------------------------------------------
 *
 * citus_guard.h
 *	  lockfence on Citus: fail closed where lockfence cannot guarantee the
 *	  fence (citus_guard.c), and find the local shard of a distributed
 *	  lockfence.fences (citus_fences.c).
 *
 * IDENTIFICATION
 *	  src/citus_guard.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_CITUS_GUARD_H
#define LOCKFENCE_CITUS_GUARD_H

#include "compat.h"
#include "executor/spi.h"
#include "utils/relcache.h"

/* Raise feature_not_supported: Citus' catalog lacks what (its name). */
pg_noreturn extern void lockfence_citus_catalog_missing(const char *what);

/*
 * Raise feature_not_supported unless a lockfence trigger with this
 * resource column (NULL for a fixed resource) and prefix can check the
 * rows of rel where they are written: rel is not a Citus table nor a shard
 * of one, or it is (a shard of) a hash-distributed table whose
 * distribution column is the resource column, co-located with a
 * distributed lockfence.fences.  Costs one test of a cached flag on a
 * server without Citus.
 */
extern void lockfence_citus_guard_relation(Relation rel,
										   const char *resource_column,
										   const char *resource_prefix);

/*
 * Raise feature_not_supported when lockfence.fences is a Citus table that
 * lockfence cannot read in a local shard (not hash-distributed by
 * resource with one placement per shard).  Costs one test of a cached
 * flag in the steady state.
 */
extern void lockfence_citus_guard_fences(void);

/*
 * The Citus table whose shard the table relname in schema nspid is (by its
 * name and pg_dist_shard), or InvalidOid.
 */
extern Oid	lockfence_citus_shard_owner(const char *relname, Oid nspid);

/* Is Citus installed in this database (cached)? */
extern bool lockfence_citus_present(void);

/* The TRUNCATE guard for shards (citus_truncate.c), from _PG_init. */
extern void citus_truncate_init(void);

/* Is lockfence.fences hash-distributed by resource (citus_distribute)? */
extern bool lockfence_citus_fences_distributed(void);

/*
 * The local shard of a distributed lockfence.fences that holds resource,
 * InvalidOid when lockfence.fences is not distributed; raises
 * feature_not_supported when the shard is on another node.
 */
extern Oid	lockfence_citus_fence_shard(const char *resource);

/*
 * The kept plan of sql, one of lockfence's statements on lockfence.fences,
 * made for shard (from lockfence_citus_fence_shard, just before): the
 * table's name replaced by the shard's, planned on first use and kept
 * until Citus' metadata changes.  slot numbers the statement text: the
 * callers' ranges below.  Call inside SPI.
 */
#define LOCKFENCE_CITUS_SLOTS_FENCE	0	/* fence_store.c: 0-99 */
#define LOCKFENCE_CITUS_SLOTS_LEASE	100 /* lease.c: 100-199 */
extern SPIPlanPtr lockfence_citus_shard_plan(Oid shard, int slot, const char *sql,
											 int nargs, const Oid *argtypes);

/*
 * The plan kept for shard and slot, or NULL when there is none yet: a
 * caller that builds its statement text asks first, and builds it only
 * for lockfence_citus_shard_plan's first use.
 */
extern SPIPlanPtr lockfence_citus_kept_plan(Oid shard, int slot);

#endif							/* LOCKFENCE_CITUS_GUARD_H */
