/*-------------------------------------------------------------------------
 *
 * fence_trigger.c
 *	  lockfence.fence_trigger(): fail-closed fencing of protected tables.
 *
 * A BEFORE ROW trigger on INSERT, UPDATE and DELETE (and a BEFORE
 * STATEMENT trigger on TRUNCATE) rejects every write that does not carry
 * an acceptable token.  Trigger arguments are key=value pairs:
 *
 *	resource=NAME			the resource is the fixed name NAME, or
 *	resource_column=COL		the resource is the row's COL value,
 *	resource_prefix=TEXT	  optionally prefixed with TEXT;
 *	token_column=COL		the token may come from the bigint COL of the
 *							  new row (else: this transaction's fence);
 *	holder_column=COL		the holder comes from the row's COL.
 *
 * A token must come from the writer.  A row PRESENTS a token when it is an
 * INSERT whose token column is not NULL, or an UPDATE whose new token
 * differs from the old row's (NULL to a value counts).  An UPDATE that
 * leaves the token unchanged presents none, whatever its SET list names:
 * the decision looks only at the two row versions, never at the kind of
 * statement (plain UPDATE, MERGE, WITH, ON CONFLICT, nested in a function),
 * which a trigger cannot reliably know.
 *
 * A presented token is accepted when this transaction has already fenced
 * the resource with it (lockfence.fence() or an earlier row), or when it is
 * higher than the recorded fence, or the resource has none (it advances
 * the fence).  A presented token EQUAL to the fence and not fenced by this
 * transaction may be a copy of a stored value (an ORM saving every column
 * it loaded, INSERT ... SELECT of the token column, a subquery reading
 * another row's token): it is refused as a missing token (LF002).  A lower
 * token is stale (LF001).
 *
 * An UPDATE that moves a row to another partition is carried out as a
 * DELETE and an INSERT into the new partition, whose trigger fires too:
 * that INSERT presents the row's token only if the UPDATE did
 * (fence_trigger_move_note and fence_trigger_move_taken).
 *
 * A row that presents no token (and every DELETE and TRUNCATE) uses the
 * token this transaction fenced for the resource; without one the write is
 * rejected (LF002).  So a holder writing under one lock across many
 * transactions calls lockfence.fence() once at the start of each, after
 * which every row is a hash lookup in the transaction's cache.
 *
 * Per row, the trigger remembers the last resource it named (the column's
 * datum and the name made from it) and whether the transaction's cache
 * held a token for it, at which generation of that cache
 * (fence_cache_generation): a next row of the same resource, the common
 * case of a bulk write, then costs a comparison of datums instead of an
 * output function call, a validation and a hash look-up.
 *
 * IDENTIFICATION
 *	  src/fence_trigger.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/syscache.h"

#include "citus_guard.h"
#include "compat.h"
#include "fence_trigger.h"
#include "lockfence.h"
#include "lockfence_schema.h"
#include "metrics.h"

PG_FUNCTION_INFO_V1(lockfence_fence_trigger);

/*
 * Column attnum of tuple, one of the rows the trigger fires for, read
 * through the trigger manager's slot for that row when there is one: the
 * slot keeps what it deformed, so a second column of the row costs an
 * array access, where heap_getattr walks the tuple again for every column
 * after a variable-length one (the token column behind the resource
 * column: about 160 instructions a read).
 */
static Datum
fence_trigger_getattr(TriggerData *trigdata, HeapTuple tuple,
					  AttrNumber attnum, bool *isnull)
{
	if (tuple == trigdata->tg_newtuple && trigdata->tg_newslot != NULL)
		return slot_getattr(trigdata->tg_newslot, attnum, isnull);
	if (tuple == trigdata->tg_trigtuple && trigdata->tg_trigslot != NULL)
		return slot_getattr(trigdata->tg_trigslot, attnum, isnull);
	return heap_getattr(tuple, attnum, RelationGetDescr(trigdata->tg_relation),
						isnull);
}

/*
 * Is value the resource column's value that the memory holds?  Only a
 * value whose bytes fit the memory is kept there (not a compressed or
 * out-of-line one).
 */
static bool
fence_trigger_memo_matches(FenceTriggerConfig *config, Datum value)
{
	if (!config->memo_valid)
		return false;
	if (config->resource_typlen == -1 && VARATT_IS_EXTENDED(DatumGetPointer(value)) &&
		!VARATT_IS_SHORT(DatumGetPointer(value)))
		return false;
	return datumIsEqual(config->memo_datum, value, config->resource_typbyval,
						config->resource_typlen);
}

/* Remember value as naming resource (already validated), if it fits. */
static void
fence_trigger_memo_store(FenceTriggerConfig *config, Datum value,
						 const char *resource)
{
	Size		size;

	config->memo_valid = false;
	config->memo_fenced = false;
	if (config->resource_typbyval)
		config->memo_datum = value;
	else
	{
		if (config->resource_typlen == -1)
		{
			if (VARATT_IS_EXTENDED(DatumGetPointer(value)) &&
				!VARATT_IS_SHORT(DatumGetPointer(value)))
				return;
			size = VARSIZE_ANY(DatumGetPointer(value));
		}
		else if (config->resource_typlen > 0)
			size = config->resource_typlen;
		else
			return;				/* cstring: not kept */
		if (size > MEMO_DATUM_BYTES)
			return;
		memcpy(config->memo_datum_bytes, DatumGetPointer(value), size);
		config->memo_datum = PointerGetDatum(config->memo_datum_bytes);
	}
	strlcpy(config->memo_resource, resource, sizeof(config->memo_resource));
	config->memo_valid = true;
}

/*
 * The resource a row belongs to.  With memo, the name of the last row's
 * resource is reused when the column holds the same value, and a new one
 * is remembered: only the row the trigger checks uses the memory (not the
 * old row of an UPDATE that moves it to another resource).
 */
static char *
fence_trigger_resource(FenceTriggerConfig *config, TriggerData *trigdata,
					   HeapTuple tuple, bool memo)
{
	Datum		value;
	bool		isnull;
	char	   *resource;

	if (config->resource != NULL)
		return config->resource;

	value = fence_trigger_getattr(trigdata, tuple, config->resource_attnum,
								  &isnull);
	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("resource column \"%s\" of a protected row is null",
						config->resource_column),
				 errdetail("A row without a resource cannot be fenced.")));
	if (memo && fence_trigger_memo_matches(config, value))
		return config->memo_resource;
	resource = OutputFunctionCall(&config->resource_out, value);
	if (config->resource_prefix[0] != '\0')
		resource = psprintf("%s%s", config->resource_prefix, resource);
	lockfence_validate_resource(resource);
	if (memo)
	{
		fence_trigger_memo_store(config, value, resource);
		if (config->memo_valid)
			return config->memo_resource;
	}
	return resource;
}

/*
 * Has this transaction fenced resource?  The memory answers for the last
 * row's resource while the transaction's cache has not changed since.
 */
static bool
fence_trigger_fenced(FenceTriggerConfig *config, const char *resource)
{
	int64		token;
	const char *holder;
	uint64		generation = fence_cache_generation();
	bool		memo_resource = resource == config->resource ||
		(config->memo_valid && resource == config->memo_resource);

	if (memo_resource && config->memo_fenced &&
		config->memo_generation == generation)
		return true;
	if (!fence_cache_lookup(resource, &token, &holder))
		return false;
	if (memo_resource)
	{
		config->memo_fenced = true;
		config->memo_generation = generation;
	}
	return true;
}

static bool fence_trigger_owner_may_fence(Relation rel);

/*
 * Count and log a write refused for want of a token, except on a temporary
 * table whose owner may not fence (fence_trigger_check_owner_may_fence):
 * any role may put the trigger on a temporary table of its own, and its
 * refusals would move the cluster's counter and top list for any resource
 * name.  A permanent table is always counted: one whose owner was not
 * granted fence() is still a protected table whose writers lack tokens.
 */
static void
fence_trigger_count_missing(Relation rel, const char *resource)
{
	if (rel->rd_rel->relpersistence != RELPERSISTENCE_TEMP ||
		fence_trigger_owner_may_fence(rel))
		lockfence_metrics_missing_token(RelationGetRelationName(rel), resource);
}

static void
fence_trigger_report_missing(FenceTriggerConfig *config, Relation rel,
							 const char *resource)
{
	fence_trigger_count_missing(rel, resource);
	ereport(ERROR,
			(errcode(ERRCODE_LOCKFENCE_MISSING_TOKEN),
			 errmsg("write to protected table \"%s\" carries no fencing token",
					RelationGetRelationName(rel)),
			 config->token_column ?
			 errdetail("Resource \"%s\" was not fenced in this transaction, and the write does not give column \"%s\" a token of its own.",
					   resource, config->token_column) :
			 errdetail("Resource \"%s\" was not fenced in this transaction.",
					   resource),
			 errhint("Call lockfence.fence() with the token of the lock you hold for this resource before writing.")));
}

/*
 * A presented token equal to the recorded fence, which this transaction has
 * not fenced: refused like a missing token, since it may be a copy.
 */
static void
fence_trigger_report_copied(FenceTriggerConfig *config, Relation rel,
							const char *resource, int64 token)
{
	fence_trigger_count_missing(rel, resource);
	ereport(ERROR,
			(errcode(ERRCODE_LOCKFENCE_MISSING_TOKEN),
			 errmsg("write to protected table \"%s\" carries no fencing token",
					RelationGetRelationName(rel)),
			 errdetail("Token " INT64_FORMAT " in column \"%s\" equals the current fence of resource \"%s\" and was not fenced in this transaction, so it may have been copied from the table.",
					   token, config->token_column, resource),
			 errhint("Call lockfence.fence(%s, " INT64_FORMAT ") in this transaction before writing.",
					 quote_literal_cstr(resource), token)));
}

/*
 * The holder named by a row, or NULL.
 */
static const char *
fence_trigger_holder(FenceTriggerConfig *config, TriggerData *trigdata,
					 HeapTuple tuple)
{
	bool		isnull;
	Datum		value;

	if (config->holder_attnum == 0)
		return NULL;
	value = fence_trigger_getattr(trigdata, tuple, config->holder_attnum,
								  &isnull);
	return isnull ? NULL : OutputFunctionCall(&config->holder_out, value);
}

/*
 * A row token the transaction has not fenced is a fence check that may
 * advance the fence, as lockfence.fence() does, and fence() is not
 * PUBLIC's (since 1.4).  Any role may put a lockfence trigger on a table
 * it owns (a temporary one will do): the trigger lets a row advance a
 * fence only when the table's owner may execute
 * lockfence.fence(text, bigint, text).  Protecting a table hands that
 * right to the roles that may write it; it cannot create it.
 */
static bool
fence_trigger_owner_may_fence(Relation rel)
{
	Oid			argtypes[3] = {TEXTOID, INT8OID, TEXTOID};
	Oid			fence_fn;

	/* by the schema's OID: the writer needs no USAGE on it */
	fence_fn = GetSysCacheOid3(PROCNAMEARGSNSP, Anum_pg_proc_oid,
							   CStringGetDatum("fence"),
							   PointerGetDatum(buildoidvector(argtypes, 3)),
							   ObjectIdGetDatum(lockfence_schema_oid()));
	return OidIsValid(fence_fn) &&
		lf_proc_aclcheck(fence_fn, rel->rd_rel->relowner, ACL_EXECUTE) ==
		ACLCHECK_OK;
}

static void
fence_trigger_check_owner_may_fence(Relation rel, const char *resource)
{
	Oid			owner = rel->rd_rel->relowner;

	if (fence_trigger_owner_may_fence(rel))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied to fence resource \"%s\" with a token from a row of table \"%s\"",
					resource, RelationGetRelationName(rel)),
			 errdetail("A row token this transaction has not fenced is checked as lockfence.fence() would, and the table's owner, role \"%s\", may not execute lockfence.fence(text, bigint, text).",
					   GetUserNameFromId(owner, false)),
			 errhint("Grant it to the table's owner (lockfence.grant_usage), or call lockfence.fence() in the transaction before writing.")));
}

/*
 * Fence one resource for a row write.  The token is the row's own when the
 * write presents one (see fence_trigger_presented_token), else this
 * transaction's for the resource.  Returns true only when a token was
 * accepted; every other path raises.
 */
static bool
fence_trigger_row(FenceTriggerConfig *config, TriggerData *trigdata,
				  HeapTuple tuple, const char *resource, bool presented,
				  int64 token)
{
	Relation	rel = trigdata->tg_relation;
	const char *holder;
	FenceOutcome outcome;

	if (presented)
	{
		holder = fence_trigger_holder(config, trigdata, tuple);
		if (!fence_cache_covers(resource, token, holder))
			fence_trigger_check_owner_may_fence(rel, resource);
		switch (lockfence_check(resource, token, holder, true,
								"lockfence.fence_trigger()", &outcome))
		{
			case FENCE_ACCEPTED:
				return true;
			case FENCE_NOT_ADVANCED:
				fence_trigger_report_copied(config, rel, resource, token);
				break;
			case FENCE_STALE:
			case FENCE_HOLDER_CONFLICT:
			case FENCE_LEASE_LOST:
				lockfence_report_rejection(resource, token, holder, &outcome);
				break;
		}
		return false;
	}

	if (fence_trigger_fenced(config, resource))
		return true;
	fence_trigger_report_missing(config, rel, resource);
	return false;
}

/*
 * The trigger's last word before letting a write through: a write that no
 * path above accepted is counted in proceeded_without_lock_total and
 * refused.  Only a bug in this file can get here.
 */
static void
fence_trigger_require_fenced(bool fenced, Relation rel)
{
	if (fenced)
		return;
	lockfence_metrics_proceeded_without_lock(RelationGetRelationName(rel));
	ereport(ERROR,
			(errcode(ERRCODE_INTERNAL_ERROR),
			 errmsg("write to protected table \"%s\" was not fenced",
					RelationGetRelationName(rel)),
			 errdetail("The lockfence trigger found no accepted token for the write; this is a bug in lockfence.")));
}

/*
 * Does this write present a token of its own, and which?
 *
 * An INSERT presents its token column unless it is NULL.  An UPDATE
 * presents it only when it changed: an unchanged value may have been
 * carried over (SET tok = tok, an ORM saving every column, a MERGE action
 * that did not run), and nothing in a row trigger says reliably which
 * statement named the column.  A DELETE presents nothing.
 */
static bool
fence_trigger_presented_token(FenceTriggerConfig *config,
							  TriggerData *trigdata, int64 *token)
{
	bool		oldnull;
	bool		newnull;
	Datum		oldvalue;
	Datum		newvalue;

	if (config->token_attnum == 0 || TRIGGER_FIRED_BY_DELETE(trigdata->tg_event))
		return false;

	if (TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
		newvalue = fence_trigger_getattr(trigdata, trigdata->tg_trigtuple,
										 config->token_attnum, &newnull);
	else
	{
		newvalue = fence_trigger_getattr(trigdata, trigdata->tg_newtuple,
										 config->token_attnum, &newnull);
		oldvalue = fence_trigger_getattr(trigdata, trigdata->tg_trigtuple,
										 config->token_attnum, &oldnull);
		if (!newnull && !oldnull &&
			DatumGetInt64(oldvalue) == DatumGetInt64(newvalue))
			return false;
	}
	if (newnull)
		return false;
	*token = DatumGetInt64(newvalue);
	return true;
}

/*
 * The last UPDATE of a partition whose row presented no token, kept until
 * PostgreSQL inserts the row into another partition if the UPDATE moves
 * it.  It fires that partition's BEFORE INSERT trigger right after the
 * UPDATE's own triggers and the DELETE's, in the same command, with the
 * row the UPDATE's trigger judged.  Judged as an INSERT, the unchanged
 * token would count as presented: refused as stale when the transaction
 * fenced a newer token than the row's (a holder moving its own row), or
 * advancing the fence of the row's new resource to a token nobody
 * presented.
 *
 * A move is recognised by the same command, the same generation of the
 * transaction's cache, the DELETE of the UPDATE's old row in between
 * (which a plain INSERT, even one in the same statement, does not have),
 * another partition, and the same resource and token.  Any other INSERT that matched would be judged as a row without
 * a token: accepted only if the transaction fenced its resource, so never
 * a write the transaction has not fenced.  A move missed (a trigger of
 * the partitions ran SQL in between, which advances the command) is
 * judged as an INSERT, as before: refused or advancing, never accepted
 * unfenced.
 */
typedef struct FenceTriggerMove
{
	bool		valid;
	bool		deleted;		/* the DELETE of the old row followed */
	uint64		cache_generation;
	CommandId	command_id;
	Oid			from_relid;
	ItemPointerData from_tid;	/* the old row */
	int64		token;
	char		resource[LOCKFENCE_MAX_RESOURCE_BYTES + 1];
} FenceTriggerMove;

static FenceTriggerMove fence_trigger_move;

/* After an UPDATE of a partition that presented no token: remember it. */
static void
fence_trigger_move_note(FenceTriggerConfig *config, TriggerData *trigdata,
						const char *resource)
{
	bool		isnull;
	Datum		value;

	fence_trigger_move.valid = false;
	if (config->token_attnum == 0)
		return;
	value = fence_trigger_getattr(trigdata, trigdata->tg_newtuple,
								  config->token_attnum, &isnull);
	if (isnull)
		return;					/* an INSERT of it presents nothing anyway */
	fence_trigger_move.deleted = false;
	fence_trigger_move.cache_generation = fence_cache_generation();
	fence_trigger_move.command_id = GetCurrentCommandId(false);
	fence_trigger_move.from_relid = RelationGetRelid(trigdata->tg_relation);
	fence_trigger_move.from_tid = trigdata->tg_trigtuple->t_self;
	fence_trigger_move.token = DatumGetInt64(value);
	strlcpy(fence_trigger_move.resource, resource,
			sizeof(fence_trigger_move.resource));
	fence_trigger_move.valid = true;
}

/* A DELETE from a partition: is it of the UPDATE's old row? */
static void
fence_trigger_move_delete(TriggerData *trigdata)
{
	if (fence_trigger_move.valid &&
		fence_trigger_move.command_id == GetCurrentCommandId(false) &&
		fence_trigger_move.from_relid == RelationGetRelid(trigdata->tg_relation) &&
		ItemPointerEquals(&fence_trigger_move.from_tid,
						  &trigdata->tg_trigtuple->t_self))
		fence_trigger_move.deleted = true;
	else
		fence_trigger_move.valid = false;
}

/*
 * Is this INSERT into a partition, presenting token for resource, the
 * second half of the UPDATE remembered?  Forgets it either way.
 */
static bool
fence_trigger_move_taken(TriggerData *trigdata, const char *resource,
						 int64 token)
{
	bool		taken;

	if (!fence_trigger_move.valid)
		return false;
	taken = fence_trigger_move.deleted &&
		fence_trigger_move.cache_generation == fence_cache_generation() &&
		fence_trigger_move.command_id == GetCurrentCommandId(false) &&
		fence_trigger_move.from_relid != RelationGetRelid(trigdata->tg_relation) &&
		fence_trigger_move.token == token &&
		strcmp(fence_trigger_move.resource, resource) == 0;
	fence_trigger_move.valid = false;
	return taken;
}

/*
 * Does an UPDATE keep the resource column's value, bit for bit?
 */
static bool
fence_trigger_same_resource(FenceTriggerConfig *config, TriggerData *trigdata,
							TupleDesc tupdesc)
{
	Form_pg_attribute att = TupleDescAttr(tupdesc, config->resource_attnum - 1);
	bool		oldnull;
	bool		newnull;
	Datum		oldvalue = fence_trigger_getattr(trigdata, trigdata->tg_trigtuple,
												 config->resource_attnum,
												 &oldnull);
	Datum		newvalue = fence_trigger_getattr(trigdata, trigdata->tg_newtuple,
												 config->resource_attnum,
												 &newnull);

	if (oldnull || newnull)
		return false;			/* let fence_trigger_resource() report it */
	return datumIsEqual(oldvalue, newvalue, att->attbyval, att->attlen);
}

/*
 * TRUNCATE (a statement trigger): only a table of one fixed resource can
 * be truncated, by a transaction that fenced it.
 */
static void
fence_trigger_truncate(FenceTriggerConfig *config, Relation rel)
{
	int64		token;
	const char *holder;
	bool		fenced;

	if (config->resource == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot truncate protected table \"%s\"",
						RelationGetRelationName(rel)),
				 errdetail("Its rows belong to many resources, and TRUNCATE cannot be fenced for each of them."),
				 errhint("Use DELETE, which is fenced row by row.")));
	fenced = fence_cache_lookup(config->resource, &token, &holder);
	if (!fenced)
		fence_trigger_report_missing(config, rel, config->resource);
	fence_trigger_require_fenced(fenced, rel);
}

/*
 * lockfence.fence_trigger()
 */
Datum
lockfence_fence_trigger(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	FenceTriggerConfig *config;
	TupleDesc	tupdesc;
	HeapTuple	tuple;
	char	   *resource;
	bool		presented;
	int64		token = 0;
	bool		fenced;
	bool		is_partition;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("lockfence.fence_trigger() was not called by the trigger manager")));

	/* Once per statement; validated again if the table changed since. */
	config = (FenceTriggerConfig *) fcinfo->flinfo->fn_extra;
	if (config == NULL)
	{
		config = fence_trigger_config(trigdata->tg_trigger,
									  trigdata->tg_relation);
		fcinfo->flinfo->fn_extra = config;
	}

	if (TRIGGER_FIRED_BY_TRUNCATE(trigdata->tg_event))
	{
		fence_trigger_truncate(config, trigdata->tg_relation);
		return PointerGetDatum(NULL);
	}

	tupdesc = RelationGetDescr(trigdata->tg_relation);
	tuple = TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) ?
		trigdata->tg_newtuple : trigdata->tg_trigtuple;

	resource = fence_trigger_resource(config, trigdata, tuple, true);
	presented = fence_trigger_presented_token(config, trigdata, &token);
	is_partition = trigdata->tg_relation->rd_rel->relispartition;
	if (is_partition && presented &&
		TRIGGER_FIRED_BY_INSERT(trigdata->tg_event) &&
		fence_trigger_move_taken(trigdata, resource, token))
		presented = false;
	fenced = fence_trigger_row(config, trigdata, tuple, resource, presented,
							   token);

	/*
	 * A row moving to another resource must be fenced for both.  Most
	 * UPDATEs leave the resource column alone: an unchanged datum names the
	 * same resource, which spares converting the old value to text.
	 */
	if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) && config->resource == NULL &&
		!fence_trigger_same_resource(config, trigdata, tupdesc))
	{
		char	   *old_resource = fence_trigger_resource(config, trigdata,
														  trigdata->tg_trigtuple,
														  false);

		if (strcmp(old_resource, resource) != 0)
			fenced = fence_trigger_row(config, trigdata,
									   trigdata->tg_trigtuple,
									   old_resource, false, 0) && fenced;
	}

	fence_trigger_require_fenced(fenced, trigdata->tg_relation);
	if (is_partition && !presented &&
		TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
		fence_trigger_move_note(config, trigdata, resource);
	else if (is_partition && TRIGGER_FIRED_BY_DELETE(trigdata->tg_event))
		fence_trigger_move_delete(trigdata);
	return PointerGetDatum(tuple);
}
