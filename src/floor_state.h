/*-------------------------------------------------------------------------
 *
 * floor_state.h
 *	  The recorded identity and the global fence floor (floor_state.c).
 *
 * IDENTIFICATION
 *	  src/floor_state.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_FLOOR_STATE_H
#define LOCKFENCE_FLOOR_STATE_H

#include "access/htup.h"
#include "access/tupdesc.h"
#include "access/xlogdefs.h"

#include "lockfence.h"

/* lockfence.floor_state as read, judged against one identity. */
typedef struct FloorState
{
	bool		have_table;		/* false: SQL older than 1.4 */
	int			nrows;
	bool		mismatch;		/* a row names another identity */
	int64		rec_sysid;		/* the row reported: a mismatching one if */
	int64		rec_tli;		/* any, else the last one */
	Oid			rec_database;	/* its database (InvalidOid: not recorded) */
	bool		adopt;			/* an empty copy's row: record it as ours */
	TimestampTz recorded_at;
	int64		floor;			/* the highest floor of all rows */
} FloorState;

/*
 * This server's identity: its system identifier and the timeline it
 * writes (during recovery: the timeline it replays).
 */
extern void floor_state_identity(int64 *sysid, TimeLineID *tli,
								 bool *in_recovery);

/* The OID of lockfence.floor_state, InvalidOid when there is none. */
extern Oid	floor_state_relid(void);

/*
 * Does lockfence.floor_state (relid) record the database (SQL 1.10 and
 * later)?
 */
extern bool floor_state_has_database(Oid relid);

/* Column col of an SPI result row as int64 (0 when NULL). */
extern int64 floor_state_int64(HeapTuple tuple, TupleDesc tupdesc, int col);

/*
 * Read lockfence.floor_state and judge it against (sysid, tli) and this
 * database.
 */
extern void floor_state_read(int64 sysid, TimeLineID tli, FloorState *st);

/* Would these contents refuse fenced writes on a writable server? */
extern bool floor_state_refuses(const FloorState *st);

/* This backend's kept verdict (floor_state.c) */
extern bool floor_state_refused(TimeLineID tli);
extern const FloorState *floor_state_cached(void);
extern void floor_state_forget(void);

/*
 * The global fence floor (0: none): the fence of every resource that has
 * no row.
 */
extern int64 lockfence_failover_floor(void);

/*
 * For a resource without a fence row: true, with a stale verdict in
 * *outcome, when token is below the global floor.
 */
extern bool lockfence_failover_floor_rejects(int64 token,
											 FenceOutcome *outcome);

/*
 * For a resource with a fence row: true, with a stale verdict in *outcome,
 * when token is below the floor the failover guard last read.
 */
extern bool lockfence_kept_floor_rejects(int64 token, FenceOutcome *outcome);

/* Is a fenced write refused now (for the floor_required metric)? */
extern bool lockfence_failover_floor_required(void);

#endif							/* LOCKFENCE_FLOOR_STATE_H */
