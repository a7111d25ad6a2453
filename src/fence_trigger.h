/*-------------------------------------------------------------------------
 *
 * fence_trigger.h
 *	  lockfence.fence_trigger()'s configuration: its key=value arguments,
 *	  validated against its table (fence_trigger_config.c), and what the
 *	  row path (fence_trigger.c) remembers between rows.
 *
 * IDENTIFICATION
 *	  src/fence_trigger.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_FENCE_TRIGGER_H
#define LOCKFENCE_FENCE_TRIGGER_H

#include "commands/trigger.h"
#include "fmgr.h"
#include "utils/relcache.h"

#include "lockfence.h"

/* Longest resource column datum the per-row memory keeps. */
#define MEMO_DATUM_BYTES	(LOCKFENCE_MAX_RESOURCE_BYTES + VARHDRSZ)

/*
 * A trigger's arguments, bound to its table, and what the last row told;
 * kept per trigger (fence_trigger_config) and in fn_extra.
 */
typedef struct FenceTriggerConfig
{
	char	   *resource;		/* fixed resource, or NULL */
	AttrNumber	resource_attnum;	/* resource column, or 0 */
	char	   *resource_column;
	char	   *resource_prefix;	/* "" when not given */
	FmgrInfo	resource_out;	/* output function of the resource column */
	int16		resource_typlen;
	bool		resource_typbyval;
	AttrNumber	token_attnum;	/* token column, or 0 */
	char	   *token_column;
	AttrNumber	holder_attnum;	/* holder column, or 0 */
	FmgrInfo	holder_out;

	/*
	 * The last resource a row's column named: memo_datum is the column's
	 * value (a copy of its bytes unless by value), memo_resource the name
	 * made from it, already validated.  memo_fenced: the transaction's
	 * cache held a token for memo_resource (or for the fixed resource) at
	 * generation memo_generation.
	 */
	bool		memo_valid;
	Datum		memo_datum;
	char		memo_datum_bytes[MEMO_DATUM_BYTES];
	char		memo_resource[LOCKFENCE_MAX_RESOURCE_BYTES + 1];
	bool		memo_fenced;
	uint64		memo_generation;
} FenceTriggerConfig;

/*
 * The validated configuration of trigger on rel: kept from an earlier
 * statement while the table is unchanged, else validated now (raising if
 * the trigger or table no longer passes).
 */
extern FenceTriggerConfig *fence_trigger_config(Trigger *trigger, Relation rel);

/*
 * Is funcoid lockfence.fence_trigger()?  (By name in the extension's
 * schema.)
 */
extern bool lockfence_is_fence_trigger_function(Oid funcoid);

#endif							/* LOCKFENCE_FENCE_TRIGGER_H */
