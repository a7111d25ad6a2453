/*-------------------------------------------------------------------------
 *
 * shmem_hooks.c
 *	  The library's one place in PostgreSQL's shared-memory hook chains.
 *
 * Shared memory exists only when the library is in
 * shared_preload_libraries: then the metrics (metrics.c) and the lease
 * waits' condition variables (lease_wait.c) ask for their part, and
 * attach to it, in that order, after whatever was loaded before.
 * Without preloading, both modules work without it (no metrics; lease
 * waiters poll).
 *
 * IDENTIFICATION
 *	  src/shmem_hooks.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/ipc.h"

#include "shmem_hooks.h"

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* shmem_request_hook: reserve every module's part */
static void
lockfence_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	lockfence_metrics_shmem_request();
	lease_wait_shmem_request();
}

/* shmem_startup_hook: create or attach to every module's part */
static void
lockfence_shmem_startup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	lockfence_metrics_shmem_startup();
	lease_wait_shmem_startup();
}

/*
 * Install the hooks when the library is being preloaded.  Called from
 * _PG_init.
 */
void
lockfence_shmem_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = lockfence_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = lockfence_shmem_startup;
}
