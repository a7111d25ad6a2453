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
 * A row that presents no token (and every DELETE and TRUNCATE) uses the
 * token this transaction fenced for the resource; without one the write is
 * rejected (LF002).  So a holder writing under one lock across many
 * transactions calls lockfence.fence() once at the start of each, after
 * which every row is a hash lookup in the transaction's cache.
 *
 * The same validation runs when the trigger is created (from the
 * extension's event trigger, through lockfence.check_trigger()) and on the
 * first row of every statement whose table changed since (any ALTER TABLE,
 * CREATE or DROP TRIGGER sends a relcache invalidation of the table), so
 * that a later ALTER TABLE cannot turn the trigger into a silent pass.
 * Between such changes the validated configuration is kept per trigger:
 * parsing and validating it cost about 1,700 instructions per statement
 * (bench/profile.sh), more than the rest of the trigger's work for a
 * single-row UPDATE.
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

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "parser/parse_relation.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/syscache.h"

#include "citus_guard.h"
#include "compat.h"
#include "lockfence.h"
#include "lockfence_schema.h"
#include "metrics.h"
#include "relcache_callbacks.h"

PG_FUNCTION_INFO_V1(lockfence_fence_trigger);
PG_FUNCTION_INFO_V1(lockfence_check_trigger);

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
 * Refuse trigger definitions that could let a write through unchecked.
 */
static void
fence_trigger_check_definition(Trigger *trigger, Relation rel)
{
	const char *relname = RelationGetRelationName(rel);
	int16		tgtype = trigger->tgtype;

	if (!TRIGGER_FOR_BEFORE(tgtype))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("trigger \"%s\" on table \"%s\" must fire BEFORE the write",
						trigger->tgname, relname),
				 errdetail("An AFTER or INSTEAD OF trigger cannot stop a write it does not see first.")));

	if (TRIGGER_FOR_ROW(tgtype))
	{
		if (!TRIGGER_FOR_INSERT(tgtype) || !TRIGGER_FOR_UPDATE(tgtype) ||
			!TRIGGER_FOR_DELETE(tgtype))
			ereport(ERROR,
					(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
					 errmsg("trigger \"%s\" on table \"%s\" must fire on INSERT, UPDATE and DELETE",
							trigger->tgname, relname),
					 errdetail("A write of a kind the trigger does not cover would proceed without a token.")));
		if (trigger->tgnattr > 0)
			ereport(ERROR,
					(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
					 errmsg("trigger \"%s\" on table \"%s\" must not be limited to UPDATE OF columns",
							trigger->tgname, relname),
					 errdetail("An UPDATE of other columns would proceed without a token.")));
	}
	else if (tgtype != (TRIGGER_TYPE_BEFORE | TRIGGER_TYPE_TRUNCATE))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("statement-level trigger \"%s\" on table \"%s\" must fire on TRUNCATE only",
						trigger->tgname, relname),
				 errhint("Fence rows with FOR EACH ROW on INSERT, UPDATE and DELETE, and TRUNCATE with a separate FOR EACH STATEMENT trigger.")));

	/* Also for TRUNCATE: a statement-level WHEN (false) skips the check. */
	if (trigger->tgqual != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("trigger \"%s\" on table \"%s\" must not have a WHEN condition",
						trigger->tgname, relname),
				 TRIGGER_FOR_ROW(tgtype) ?
				 errdetail("A row the condition skips would be written without a token.") :
				 errdetail("A TRUNCATE the condition skips would proceed without a token.")));
}

/*
 * Refuse a table where another BEFORE ROW trigger on INSERT or UPDATE
 * fires after this one.  BEFORE ROW triggers fire in name order, each on
 * the row the one before returned: a later one could change the resource
 * or the token column of a row the fence has already judged, and the
 * table would store a row no fence checked.  (Earlier ones are fine: the
 * fence judges the row they leave.)  Another lockfence trigger returns
 * its row unchanged.  A disabled trigger does not count; one with a WHEN
 * condition or a column list does, as it may fire.
 */
static void
fence_trigger_check_order(Trigger *trigger, Relation rel)
{
	TriggerDesc *trigdesc = rel->trigdesc;
	bool		after_self = false;
	int			i;

	for (i = 0; trigdesc != NULL && i < trigdesc->numtriggers; i++)
	{
		Trigger    *other = &trigdesc->triggers[i];

		if (other->tgoid == trigger->tgoid)
		{
			after_self = true;
			continue;
		}
		if (!after_self || other->tgenabled == TRIGGER_DISABLED ||
			other->tgfoid == trigger->tgfoid ||
			!TRIGGER_FOR_ROW(other->tgtype) ||
			!TRIGGER_FOR_BEFORE(other->tgtype) ||
			!(TRIGGER_FOR_INSERT(other->tgtype) ||
			  TRIGGER_FOR_UPDATE(other->tgtype)))
			continue;
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("trigger \"%s\" on table \"%s\" fires after lockfence trigger \"%s\"",
						other->tgname, RelationGetRelationName(rel),
						trigger->tgname),
				 errdetail("BEFORE ROW triggers fire in name order: a later one could change a row after the fence checked it."),
				 errhint("Rename trigger \"%s\" so that its name sorts before \"%s\", or drop it.",
						 other->tgname, trigger->tgname)));
	}
}

/* What a column named in a trigger argument is used for. */
typedef enum FenceColumnUse
{
	COLUMN_TOKEN,				/* the token: bigint, written by the writer */
	COLUMN_NAME					/* a resource or holder name, made text */
} FenceColumnUse;

/*
 * Can values of this type name a resource or holder?  Only types whose text
 * form does not depend on session settings (TimeZone, DateStyle,
 * extra_float_digits, ...): otherwise one row could name two resources.
 * Not char(n) either: its values are blank-padded, so the resource a row
 * names would not be the name the lock holder fences.
 */
static bool
fence_trigger_name_type_ok(Oid typid)
{
	switch (getBaseType(typid))
	{
		case TEXTOID:
		case VARCHAROID:
		case NAMEOID:
		case INT2OID:
		case INT4OID:
		case INT8OID:
		case UUIDOID:
			return true;
		default:
			return false;
	}
}

static void fence_trigger_check_token_source(Relation rel,
											 Form_pg_attribute att,
											 const char *key);

/*
 * Look up a column named in a trigger argument, and check that it can
 * serve its use.
 */
static AttrNumber
fence_trigger_column(Relation rel, const char *key, const char *column,
					 FenceColumnUse use)
{
	AttrNumber	attnum = attnameAttNum(rel, column, false);
	Form_pg_attribute att;

	if (attnum == InvalidAttrNumber)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("column \"%s\" named by lockfence trigger argument \"%s\" does not exist in table \"%s\"",
						column, key, RelationGetRelationName(rel))));

	att = TupleDescAttr(RelationGetDescr(rel), attnum - 1);
	if (use == COLUMN_TOKEN && att->atttypid != INT8OID)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("column \"%s\" named by lockfence trigger argument \"%s\" must be of type bigint",
						column, key),
				 errdetail("Column \"%s\" of table \"%s\" is of type %s.",
						   column, RelationGetRelationName(rel),
						   format_type_be(att->atttypid))));
	if (use == COLUMN_TOKEN)
		fence_trigger_check_token_source(rel, att, key);
	if (use == COLUMN_NAME && att->attgenerated != '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_COLUMN_DEFINITION),
				 errmsg("column \"%s\" named by lockfence trigger argument \"%s\" must not be a generated column",
						column, key),
				 errdetail("A BEFORE trigger does not see the value a write gives a generated column.")));
	if (use == COLUMN_NAME && !fence_trigger_name_type_ok(att->atttypid))
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("column \"%s\" named by lockfence trigger argument \"%s\" cannot be of type %s",
						column, key, format_type_be(att->atttypid)),
				 getBaseType(att->atttypid) == BPCHAROID ?
				 errdetail("Values of type char(n) are padded with blanks, so they would not match the names given to lockfence.fence().") :
				 errdetail("Its text form depends on session settings, so one row could name different resources in different sessions."),
				 errhint("Use a column of type text, varchar, name, smallint, integer, bigint or uuid.")));
	return attnum;
}

/*
 * A token column must hold only what the writer put there: a value the
 * database supplies (a generated value, an identity, a default) would pass
 * for the writer's token on every INSERT that leaves the column out, and
 * would advance the fence past the real lock holder's token.
 */
static void
fence_trigger_check_token_source(Relation rel, Form_pg_attribute att,
								 const char *key)
{
	const char *column = NameStr(att->attname);
	const char *relname = RelationGetRelationName(rel);

	if (att->attgenerated != '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_COLUMN_DEFINITION),
				 errmsg("column \"%s\" named by lockfence trigger argument \"%s\" must not be a generated column",
						column, key),
				 errdetail("A BEFORE trigger sees a generated column's old value, not the writer's token.")));
	if (att->attidentity != '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_COLUMN_DEFINITION),
				 errmsg("column \"%s\" named by lockfence trigger argument \"%s\" must not be an identity column",
						column, key),
				 errdetail("A value the database supplies is not the writer's fencing token."),
				 errhint("Use a plain bigint column that only the writer sets: ALTER TABLE %s ALTER COLUMN %s DROP IDENTITY.",
						 quote_identifier(relname), quote_identifier(column))));
	if (att->atthasdef)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_COLUMN_DEFINITION),
				 errmsg("column \"%s\" named by lockfence trigger argument \"%s\" must not have a default",
						column, key),
				 errdetail("A value the database supplies is not the writer's fencing token."),
				 errhint("Use a plain bigint column that only the writer sets: ALTER TABLE %s ALTER COLUMN %s DROP DEFAULT.",
						 quote_identifier(relname), quote_identifier(column))));
}

static void
fence_trigger_output_function(Relation rel, AttrNumber attnum, FmgrInfo *out,
							  MemoryContext mcxt)
{
	Oid			typoutput;
	bool		typisvarlena;

	getTypeOutputInfo(TupleDescAttr(RelationGetDescr(rel), attnum - 1)->atttypid,
					  &typoutput, &typisvarlena);
	fmgr_info_cxt(typoutput, out, mcxt);
}

/* The keys a trigger argument may have, in the order of their slots. */
typedef enum FenceTriggerKey
{
	KEY_RESOURCE,
	KEY_RESOURCE_COLUMN,
	KEY_RESOURCE_PREFIX,
	KEY_TOKEN_COLUMN,
	KEY_HOLDER_COLUMN,
	NUM_KEYS
} FenceTriggerKey;

static const char *const fence_trigger_keys[NUM_KEYS] = {
	"resource", "resource_column", "resource_prefix", "token_column",
	"holder_column"
};

/*
 * Split the trigger's key=value arguments into values[], one per key.
 */
static void
fence_trigger_parse_args(Trigger *trigger, char **values, MemoryContext mcxt)
{
	int			i;

	for (i = 0; i < trigger->tgnargs; i++)
	{
		const char *arg = trigger->tgargs[i];
		const char *eq = strchr(arg, '=');
		int			k;

		for (k = 0; k < NUM_KEYS && eq != NULL; k++)
		{
			if (strlen(fence_trigger_keys[k]) == (size_t) (eq - arg) &&
				strncmp(arg, fence_trigger_keys[k], eq - arg) == 0)
				break;
		}
		if (eq == NULL || k == NUM_KEYS)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid lockfence trigger argument \"%s\"", arg),
					 errhint("Arguments are key=value, with the keys resource, resource_column, resource_prefix, token_column and holder_column.")));
		if (values[k] != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("lockfence trigger argument \"%s\" is given more than once",
							fence_trigger_keys[k])));
		values[k] = MemoryContextStrdup(mcxt, eq + 1);
	}
}

/*
 * Parse and validate a trigger's definition against its table, into a
 * config allocated in mcxt.
 */
static FenceTriggerConfig *
fence_trigger_configure(Trigger *trigger, Relation rel, MemoryContext mcxt)
{
	FenceTriggerConfig *config;
	char	   *values[NUM_KEYS] = {NULL};

	fence_trigger_check_definition(trigger, rel);
	if (TRIGGER_FOR_ROW(trigger->tgtype))
		fence_trigger_check_order(trigger, rel);
	fence_trigger_parse_args(trigger, values, mcxt);

	config = MemoryContextAllocZero(mcxt, sizeof(FenceTriggerConfig));
	config->resource = values[KEY_RESOURCE];
	config->resource_column = values[KEY_RESOURCE_COLUMN];
	config->resource_prefix = values[KEY_RESOURCE_PREFIX] ?
		values[KEY_RESOURCE_PREFIX] : "";
	config->token_column = values[KEY_TOKEN_COLUMN];

	if ((config->resource == NULL) == (config->resource_column == NULL))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lockfence trigger \"%s\" needs exactly one of the arguments resource=NAME and resource_column=COLUMN",
						trigger->tgname)));
	if (config->resource != NULL)
	{
		if (values[KEY_RESOURCE_PREFIX] != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("lockfence trigger argument \"resource_prefix\" requires \"resource_column\"")));
		lockfence_validate_resource(config->resource);
	}
	else
	{
		config->resource_attnum = fence_trigger_column(rel, "resource_column",
													   config->resource_column,
													   COLUMN_NAME);
		fence_trigger_output_function(rel, config->resource_attnum,
									  &config->resource_out, mcxt);
		config->resource_typlen =
			TupleDescAttr(RelationGetDescr(rel), config->resource_attnum - 1)->attlen;
		config->resource_typbyval =
			TupleDescAttr(RelationGetDescr(rel), config->resource_attnum - 1)->attbyval;
	}

	if (config->token_column != NULL)
		config->token_attnum = fence_trigger_column(rel, "token_column",
													config->token_column,
													COLUMN_TOKEN);
	if (values[KEY_HOLDER_COLUMN] != NULL)
	{
		config->holder_attnum = fence_trigger_column(rel, "holder_column",
													 values[KEY_HOLDER_COLUMN],
													 COLUMN_NAME);
		fence_trigger_output_function(rel, config->holder_attnum,
									  &config->holder_out, mcxt);
	}
	/* On Citus: only where the rows are beside their fences. */
	lockfence_citus_guard_relation(rel, config->resource_column,
								   config->resource_prefix);
	return config;
}

/*
 * The validated configurations, per trigger OID, each in a memory context
 * of its own.  A relcache invalidation of a trigger's table marks its entry
 * stale; the next statement validates the trigger again.  A stale entry's
 * memory may still be in use by a running statement (a function called by
 * it may change the table, e.g. GRANT, and write it again): it is retired,
 * and freed when the top transaction ends.
 */
typedef struct TriggerConfigEntry
{
	Oid			tgoid;			/* hash key */
	Oid			relid;
	bool		valid;
	MemoryContext cxt;
	FenceTriggerConfig *config;
} TriggerConfigEntry;

static HTAB *trigger_configs = NULL;
static MemoryContext trigger_configs_cxt = NULL;
static List *retired_contexts = NIL;	/* in trigger_configs_cxt */

static void
fence_trigger_invalidate(Datum arg, Oid relid)
{
	HASH_SEQ_STATUS status;
	TriggerConfigEntry *entry;

	if (trigger_configs == NULL)
		return;
	hash_seq_init(&status, trigger_configs);
	while ((entry = hash_seq_search(&status)) != NULL)
		if (!OidIsValid(relid) || entry->relid == relid)
			entry->valid = false;
}

static void
fence_trigger_xact_callback(XactEvent event, void *arg)
{
	ListCell   *lc;

	if (retired_contexts == NIL)
		return;
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			foreach(lc, retired_contexts)
				MemoryContextDelete((MemoryContext) lfirst(lc));
			list_free(retired_contexts);
			retired_contexts = NIL;
			break;
		default:
			break;
	}
}

/*
 * The validated configuration of trigger on rel: kept from an earlier
 * statement while the table is unchanged, else validated now (raising if
 * the trigger or table no longer passes).  The Citus guard runs for every
 * statement, as before: its answer does not come from rel's relcache entry.
 */
static FenceTriggerConfig *
fence_trigger_config(Trigger *trigger, Relation rel)
{
	TriggerConfigEntry *entry;
	FenceTriggerConfig *config;
	MemoryContext cxt;
	bool		found;

	if (trigger_configs == NULL)
	{
		HASHCTL		ctl;

		trigger_configs_cxt = AllocSetContextCreate(TopMemoryContext,
													"lockfence trigger configurations",
													ALLOCSET_SMALL_SIZES);
		ctl.keysize = sizeof(Oid);
		ctl.entrysize = sizeof(TriggerConfigEntry);
		ctl.hcxt = trigger_configs_cxt;
		trigger_configs = hash_create("lockfence trigger configurations", 16,
									  &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
		lockfence_relcache_register(fence_trigger_invalidate);
		RegisterXactCallback(fence_trigger_xact_callback, NULL);
	}

	entry = hash_search(trigger_configs, &trigger->tgoid, HASH_ENTER, &found);
	if (!found)
	{
		/*
		 * relid too: fence_trigger_invalidate reads it, and an entry whose
		 * first validation fails stays in the table (Valgrind saw the read).
		 */
		entry->relid = InvalidOid;
		entry->valid = false;
		entry->cxt = NULL;
		entry->config = NULL;
	}
	if (entry->valid && entry->relid == RelationGetRelid(rel))
	{
		lockfence_citus_guard_relation(rel, entry->config->resource_column,
									   entry->config->resource_prefix);
		return entry->config;
	}

	/*
	 * Validate into a new context, a child of the statement's until it
	 * passes (an error frees it with the statement); the old one may be in
	 * use, and is retired.
	 */
	cxt = AllocSetContextCreate(CurrentMemoryContext,
								"lockfence trigger configuration",
								ALLOCSET_SMALL_SIZES);
	config = fence_trigger_configure(trigger, rel, cxt);
	MemoryContextSetParent(cxt, trigger_configs_cxt);
	if (entry->cxt != NULL)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(trigger_configs_cxt);

		retired_contexts = lappend(retired_contexts, entry->cxt);
		MemoryContextSwitchTo(oldcxt);
	}
	entry->cxt = cxt;
	entry->config = config;
	entry->relid = RelationGetRelid(rel);
	entry->valid = true;
	return config;
}

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

static void
fence_trigger_report_missing(FenceTriggerConfig *config, Relation rel,
							 const char *resource)
{
	lockfence_metrics_missing_token(RelationGetRelationName(rel), resource);
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
	lockfence_metrics_missing_token(RelationGetRelationName(rel), resource);
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
static void
fence_trigger_check_owner_may_fence(Relation rel, const char *resource)
{
	Oid			owner = rel->rd_rel->relowner;
	Oid			argtypes[3] = {TEXTOID, INT8OID, TEXTOID};
	Oid			fence_fn;

	/* by the schema's OID: the writer needs no USAGE on it */
	fence_fn = GetSysCacheOid3(PROCNAMEARGSNSP, Anum_pg_proc_oid,
							   CStringGetDatum("fence"),
							   PointerGetDatum(buildoidvector(argtypes, 3)),
							   ObjectIdGetDatum(lockfence_schema_oid()));
	if (OidIsValid(fence_fn) &&
		lf_proc_aclcheck(fence_fn, owner, ACL_EXECUTE) == ACLCHECK_OK)
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
		switch (lockfence_check(resource, token, holder, true, &outcome))
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
			(errcode(ERRCODE_LOCKFENCE_MISSING_TOKEN),
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
		const char *holder;

		if (config->resource == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("cannot truncate protected table \"%s\"",
							RelationGetRelationName(trigdata->tg_relation)),
					 errdetail("Its rows belong to many resources, and TRUNCATE cannot be fenced for each of them."),
					 errhint("Use DELETE, which is fenced row by row.")));
		fenced = fence_cache_lookup(config->resource, &token, &holder);
		if (!fenced)
			fence_trigger_report_missing(config, trigdata->tg_relation,
										 config->resource);
		fence_trigger_require_fenced(fenced, trigdata->tg_relation);
		return PointerGetDatum(NULL);
	}

	tupdesc = RelationGetDescr(trigdata->tg_relation);
	tuple = TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) ?
		trigdata->tg_newtuple : trigdata->tg_trigtuple;

	resource = fence_trigger_resource(config, trigdata, tuple, true);
	presented = fence_trigger_presented_token(config, trigdata, &token);
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
	return PointerGetDatum(tuple);
}

/*
 * lockfence.check_trigger(trigger_oid oid)
 *
 * Validate a lockfence trigger, as the extension's event trigger does right
 * after CREATE TRIGGER, so that misuse is reported when it is made.
 *
 * A trigger that does not exist, or whose table was dropped while we
 * waited for its lock (lockfence.check() meets that beside a DROP TABLE,
 * and on Citus beside the deferred cleanup of a moved shard), is
 * undefined_object: the caller can tell it from a trigger that is wrong.
 */
Datum
lockfence_check_trigger(PG_FUNCTION_ARGS)
{
	Oid			tgoid = PG_GETARG_OID(0);
	Relation	tgrel;
	SysScanDesc scan;
	ScanKeyData key;
	HeapTuple	tgtuple;
	Oid			relid;
	Relation	rel;
	TriggerDesc *trigdesc;
	int			i;

	tgrel = table_open(TriggerRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_trigger_oid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(tgoid));
	scan = systable_beginscan(tgrel, TriggerOidIndexId, true, NULL, 1, &key);
	tgtuple = systable_getnext(scan);
	if (!HeapTupleIsValid(tgtuple))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("trigger with OID %u does not exist", tgoid)));
	relid = ((Form_pg_trigger) GETSTRUCT(tgtuple))->tgrelid;
	systable_endscan(scan);
	table_close(tgrel, AccessShareLock);

	rel = try_table_open(relid, AccessShareLock);
	if (rel == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("trigger with OID %u does not exist", tgoid),
				 errdetail("Its table was dropped.")));
	trigdesc = rel->trigdesc;
	for (i = 0; trigdesc != NULL && i < trigdesc->numtriggers; i++)
	{
		if (trigdesc->triggers[i].tgoid == tgoid)
			(void) fence_trigger_configure(&trigdesc->triggers[i], rel,
										   CurrentMemoryContext);
	}
	table_close(rel, AccessShareLock);

	PG_RETURN_VOID();
}
