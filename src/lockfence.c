/*-------------------------------------------------------------------------
 *
 * lockfence.c
 *	  Module initialization of the lockfence extension.
 *
 * The fence itself needs no preloading: _PG_init only registers the
 * per-transaction cache callbacks, the configuration parameters, a
 * utility hook that ends the session's etcd locks after DISCARD ALL
 * (etcd_session.c; a backend holding one has loaded the library) and
 * (1.13) an object access hook that refuses TRUNCATE of a protected
 * table's Citus shard (citus_truncate.c; Citus needs lockfence preloaded
 * on every node).  It installs no executor hook, so that nothing the
 * trigger decides depends on whether the library was loaded before or
 * during a statement.  The
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
#include "utils/builtins.h"
#include "utils/guc.h"

#include "citus_guard.h"
#include "ddl_guard.h"
#include "fence_fastpath.h"
#include "lockfence.h"
#include "metrics.h"
#include "shmem_hooks.h"

PG_MODULE_MAGIC;

/*
 * The newest SQL version this library serves (lockfence.control's
 * default_version; test/t/00_release_files.pl checks that they agree).
 * It serves every older one too.
 */
#define LOCKFENCE_LIBRARY_VERSION "1.15"

void		_PG_init(void);

PG_FUNCTION_INFO_V1(lockfence_library_version);

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
	citus_truncate_init();
	lease_wait_init();
	lockfence_shmem_init();

	MarkGUCPrefixReserved("lockfence");
}

/*
 * lockfence.library_version() returns text (1.11)
 *
 * The newest SQL version the loaded library serves.  The install and
 * upgrade scripts of 1.11 create this function first: in a backend still
 * running an older library (preloaded, the server not restarted after
 * make install) the symbol is missing, and the script fails before it
 * changes anything, rather than leave new SQL to a library that does not
 * know it.  check() compares it with the extension's version.
 */
Datum
lockfence_library_version(PG_FUNCTION_ARGS)
{
	PG_RETURN_TEXT_P(cstring_to_text(LOCKFENCE_LIBRARY_VERSION));
}
