/*-------------------------------------------------------------------------
 *
 * relcache_callbacks.c
 *	  One relcache invalidation callback for all of lockfence.
 *
 * PostgreSQL keeps room for only ten relcache callbacks in a backend
 * (MAX_RELCACHE_CALLBACKS), shared by core and every library.  Citus
 * registers five of them; with lockfence's four, a Citus worker running a
 * lockfence trigger ran out ("out of relcache_callback_list slots").  So
 * lockfence registers one callback, which calls each of its modules' in
 * the order they asked.
 *
 * IDENTIFICATION
 *	  src/relcache_callbacks.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "relcache_callbacks.h"

/* lockfence's modules with a callback: fence_shape, fence_trigger, citus_guard, floor_state */
#define LOCKFENCE_MAX_RELCACHE_CALLBACKS 8

static RelcacheCallbackFunction relcache_callbacks[LOCKFENCE_MAX_RELCACHE_CALLBACKS];
static int	relcache_callback_count = 0;

static void
lockfence_relcache_dispatch(Datum arg, Oid relid)
{
	for (int i = 0; i < relcache_callback_count; i++)
		relcache_callbacks[i] (arg, relid);
}

void
lockfence_relcache_register(RelcacheCallbackFunction fn)
{
	if (relcache_callback_count >= LOCKFENCE_MAX_RELCACHE_CALLBACKS)
		elog(FATAL, "out of lockfence relcache callback slots");
	if (relcache_callback_count == 0)
		CacheRegisterRelcacheCallback(lockfence_relcache_dispatch, (Datum) 0);
	relcache_callbacks[relcache_callback_count++] = fn;
}
