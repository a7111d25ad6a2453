/*-------------------------------------------------------------------------
 *
 * relcache_callbacks.h
 *	  One relcache invalidation callback for all of lockfence
 *	  (relcache_callbacks.c).
 *
 * IDENTIFICATION
 *	  src/relcache_callbacks.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_RELCACHE_CALLBACKS_H
#define LOCKFENCE_RELCACHE_CALLBACKS_H

#include "utils/inval.h"

/*
 * Call fn for every relcache invalidation in this backend, as
 * CacheRegisterRelcacheCallback(fn, 0) would, but through lockfence's one
 * slot.  Call once per fn.
 */
extern void lockfence_relcache_register(RelcacheCallbackFunction fn);

#endif							/* LOCKFENCE_RELCACHE_CALLBACKS_H */
