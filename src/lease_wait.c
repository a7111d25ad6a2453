/*-------------------------------------------------------------------------
 *
 * lease_wait.c
 *	  Waking lease waiters when a lease is released.
 *
 * A waiter for a held lease sleeps until the lease expires or until a
 * releasing transaction commits, whichever comes first.  Releases are
 * announced through condition variables in shared memory: a small fixed
 * array, the lease name hashed onto one slot (a collision only costs a
 * spurious wake-up and a look at the fence row).  The broadcast is made
 * from the transaction callback after the releasing transaction has
 * committed (its effects visible to new snapshots), never before: a
 * waiter woken early would only find the lease still taken.
 *
 * A waiter prepares to sleep on its slot BEFORE it looks at the fence row,
 * so a release that commits between the look and the sleep is not lost:
 * the broadcast takes the waiter off the slot's list, and its next sleep
 * returns at once.
 *
 * Shared memory exists only when lockfence is in shared_preload_libraries.
 * Without it a waiter polls: it looks at the fence row every
 * LEASE_POLL_INTERVAL_MS (and at the lease's expiry), so a release is seen
 * within that interval.  lease_try_acquire never waits, so it works the
 * same either way.
 *
 * IDENTIFICATION
 *	  src/lease_wait.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/condition_variable.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "tcop/tcopprot.h"
#include "utils/memutils.h"

#include "lease.h"
#include "lockfence.h"
#include "shmem_hooks.h"

/*
 * From libpq/libpq.h, which includes libpq-be.h and with it the GSSAPI
 * headers of a server built with GSSAPI: declared here so that building
 * lockfence does not need the Kerberos development files.
 */
extern bool pq_check_connection(void);

/* Slots of condition variables; names hash onto them. */
#define LEASE_WAIT_SLOTS	128

typedef struct LeaseWaitShared
{
	ConditionVariable cv[LEASE_WAIT_SLOTS];
} LeaseWaitShared;

/* NULL unless the library was preloaded. */
static LeaseWaitShared *lease_wait_shared = NULL;

/* The slot this backend prepared to sleep on, or -1. */
static int	lease_wait_prepared = -1;

/* Names released by the current transaction, to announce at commit. */
typedef struct PendingRelease
{
	uint32		slot;
	struct PendingRelease *next;
} PendingRelease;

static PendingRelease *pending_releases = NULL;

static void lease_wait_xact_callback(XactEvent event, void *arg);

/*
 * Called from _PG_init: the transaction callback.  (The shared memory is
 * asked for by shmem_hooks.c, when the library is being preloaded.)
 */
void
lease_wait_init(void)
{
	RegisterXactCallback(lease_wait_xact_callback, NULL);
}

/* shmem_request_hook (shmem_hooks.c): reserve the condition variables */
void
lease_wait_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(LeaseWaitShared)));
}

/* shmem_startup_hook (shmem_hooks.c): create or attach to them */
void
lease_wait_shmem_startup(void)
{
	LeaseWaitShared *w;
	bool		found;
	int			i;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	w = ShmemInitStruct("lockfence lease waits", sizeof(LeaseWaitShared),
						&found);
	if (!found)
	{
		for (i = 0; i < LEASE_WAIT_SLOTS; i++)
			ConditionVariableInit(&w->cv[i]);
	}
	LWLockRelease(AddinShmemInitLock);
	lease_wait_shared = w;
}

static uint32
lease_wait_slot(const char *name)
{
	return hash_bytes((const unsigned char *) name, strlen(name)) %
		LEASE_WAIT_SLOTS;
}

/*
 * Start listening for releases of name.  Call before looking at the fence
 * row, then lease_wait_sleep() as often as needed, then lease_wait_done().
 */
void
lease_wait_prepare(const char *name)
{
	if (lease_wait_shared == NULL)
		return;
	lease_wait_prepared = lease_wait_slot(name);
	ConditionVariablePrepareToSleep(&lease_wait_shared->cv[lease_wait_prepared]);
}

/*
 * End the session if its client has gone away.  A waiter whose client was
 * killed would otherwise wait on, be granted the lease, and hold it for a
 * whole TTL that nobody uses, keeping every other waiter out (through a
 * pooler too: it closes the server connection of a client that left in the
 * middle of a statement).  Raises FATAL ("connection to client lost") as
 * client_connection_check_interval does, but without that setting.
 * Also called once a waiting grant is made (lease_wait_check_granted): a
 * wait for the lease's row or resource lock, behind a transaction that
 * fenced the expired token or a prepared first grant, is PostgreSQL's lock
 * wait, which does not look at the client.
 */
static void
lease_wait_check_client(void)
{
	if (MyProcPort == NULL || whereToSendOutput != DestRemote)
		return;
	if (!pq_check_connection())
	{
		ClientConnectionLost = 1;
		InterruptPending = 1;
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * A lease_acquire() that may have waited has just been granted: if its
 * client went away meanwhile, end the session, which rolls the grant back
 * with the transaction, so that the next waiter is granted at once rather
 * than after a TTL nobody uses.  pq_check_connection() may reset our
 * latch: set it again, as lease_wait_sleep() does, for whoever waits next.
 */
void
lease_wait_check_granted(void)
{
	lease_wait_check_client();
	SetLatch(MyLatch);
}

/*
 * Sleep up to timeout_ms (at most LEASE_MAX_SLEEP_MS), or until a release
 * of a name on our slot has committed since the last look.  Interrupts
 * (cancel, statement_timeout, termination) are served at once; a client
 * that has gone away is noticed after each sleep, so within a second.
 */
void
lease_wait_sleep(long timeout_ms)
{
	if (timeout_ms < 1)
		timeout_ms = 1;
	if (timeout_ms > LEASE_MAX_SLEEP_MS)
		timeout_ms = LEASE_MAX_SLEEP_MS;

	if (lease_wait_shared != NULL && lease_wait_prepared >= 0)
	{
		ConditionVariableTimedSleep(&lease_wait_shared->cv[lease_wait_prepared],
									timeout_ms, PG_WAIT_EXTENSION);
		lease_wait_check_client();

		/*
		 * pq_check_connection() resets our latch when it finds it set: a
		 * release that signalled us since the sleep returned must still
		 * end the next sleep at once (it re-checks the wake-up list).
		 */
		SetLatch(MyLatch);
		return;
	}

	/* No shared memory: poll. */
	if (timeout_ms > LEASE_POLL_INTERVAL_MS)
		timeout_ms = LEASE_POLL_INTERVAL_MS;
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					 timeout_ms, PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
	lease_wait_check_client();
}

void
lease_wait_done(void)
{
	if (lease_wait_prepared >= 0)
		ConditionVariableCancelSleep();
	lease_wait_prepared = -1;
}

/*
 * Announce a release of name when (and only if) the current transaction
 * commits.
 */
void
lease_wait_announce_at_commit(const char *name)
{
	PendingRelease *p;

	if (lease_wait_shared == NULL)
		return;
	p = MemoryContextAlloc(TopTransactionContext, sizeof(PendingRelease));
	p->slot = lease_wait_slot(name);
	p->next = pending_releases;
	pending_releases = p;
}

static void
lease_wait_xact_callback(XactEvent event, void *arg)
{
	PendingRelease *p;

	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			/* Committed and visible: wake the waiters. */
			for (p = pending_releases; p != NULL; p = p->next)
				ConditionVariableBroadcast(&lease_wait_shared->cv[p->slot]);
			pending_releases = NULL;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			/* The list lived in TopTransactionContext, gone now. */
			pending_releases = NULL;
			lease_wait_prepared = -1;
			break;
		default:
			break;
	}
}
