/*-------------------------------------------------------------------------
 *
 * lockfence.c
 *	  Module initialization of the lockfence extension.
 *
 * The fence itself needs no preloading: _PG_init only registers the
 * per-transaction cache callbacks, the configuration parameters and a
 * utility hook that ends the session's etcd locks after DISCARD ALL
 * (etcd_session.c; a backend holding one has loaded the library).  It
 * installs no executor hook, so that nothing the trigger decides depends
 * on whether the library was loaded before or during a statement.  The
 * metrics (metrics.c) need shared memory, so they exist only when the
 * library is in shared_preload_libraries.
 *
 * IDENTIFICATION
 *	  src/lockfence.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/guc.h"

#include "ddl_guard.h"
#include "fence_fastpath.h"
#include "lockfence.h"
#include "metrics.h"
#include "shmem_hooks.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

/*
 * Module load callback.
 */
void
_PG_init(void)
{
	fence_cache_init();
	fence_fastpath_init();
	lockfence_metrics_init();
	lockfence_etcd_init();
	ddl_guard_init();
	lease_wait_init();
	lockfence_shmem_init();

	MarkGUCPrefixReserved("lockfence");
}
