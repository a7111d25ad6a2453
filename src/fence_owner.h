/*-------------------------------------------------------------------------
 *
 * fence_owner.h
 *	  Act as the owner of the fence table (fence_owner.c).
 *
 * IDENTIFICATION
 *	  src/fence_owner.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_FENCE_OWNER_H
#define LOCKFENCE_FENCE_OWNER_H

/* Saved state of fence_store_enter, restored by fence_store_leave. */
typedef struct FenceStoreState
{
	Oid			save_userid;
	int			save_sec_context;
} FenceStoreState;

extern void fence_store_enter(FenceStoreState *state);
extern void fence_store_leave(FenceStoreState *state);

/* Had lockfence.fences the lease columns at the last fence_store_enter? */
extern bool fence_store_has_leases(void);

#endif							/* LOCKFENCE_FENCE_OWNER_H */
