/*-------------------------------------------------------------------------
 *
 * fence_trigger_config.c
 *	  lockfence.fence_trigger()'s arguments, validated against its table
 *	  and kept per trigger; lockfence.check_trigger().
 *
 * A trigger definition that could let a write through unchecked is
 * refused: not BEFORE, not on every kind of write, with a WHEN condition
 * or a column list, followed by another BEFORE ROW trigger that may change
 * the row, naming a column of a type whose text depends on the session, or
 * a token column whose value the database supplies (generated, identity,
 * default).
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
 * IDENTIFICATION
 *	  src/fence_trigger_config.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "fmgr.h"
#include "parser/parse_relation.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/rel.h"

#include "citus_guard.h"
#include "compat.h"
#include "fence_trigger.h"
#include "lockfence.h"
#include "lockfence_schema.h"
#include "relcache_callbacks.h"

PG_FUNCTION_INFO_V1(lockfence_check_trigger);

/*
 * Refuse trigger definitions that could let a write through unchecked.
 */
static void
fence_trigger_check_definition(Trigger *trigger, Relation rel)
{
	const char *relname = RelationGetRelationName(rel);
	int16		tgtype = trigger->tgtype;

	/*
	 * (1.12) PostgreSQL allows a foreign table no TRUNCATE trigger, and a
	 * foreign data wrapper may forward TRUNCATE to the remote table: its
	 * rows could all go without a token.  Its fence belongs on the server
	 * that holds the rows.
	 */
	if (rel->rd_rel->relkind == RELKIND_FOREIGN_TABLE)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("lockfence trigger \"%s\" cannot fence foreign table \"%s\"",
						trigger->tgname, relname),
				 errdetail("A foreign table can have no TRUNCATE trigger, so TRUNCATE would empty it without a token."),
				 errhint("Protect the table on the server that holds its rows.")));

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
 * The table's name as a command in a hint must give it: schema-qualified,
 * so that the command works whatever the search_path.
 */
static char *
table_name_for_hint(Relation rel)
{
	return quote_qualified_identifier(get_namespace_name(RelationGetNamespace(rel)),
									  RelationGetRelationName(rel));
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
						 table_name_for_hint(rel), quote_identifier(column))));
	if (att->atthasdef)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_COLUMN_DEFINITION),
				 errmsg("column \"%s\" named by lockfence trigger argument \"%s\" must not have a default",
						column, key),
				 errdetail("A value the database supplies is not the writer's fencing token."),
				 errhint("Use a plain bigint column that only the writer sets: ALTER TABLE %s ALTER COLUMN %s DROP DEFAULT.",
						 table_name_for_hint(rel), quote_identifier(column))));
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
		/* Every name is the prefix and at least one byte of the column. */
		if (strlen(config->resource_prefix) >= LOCKFENCE_MAX_RESOURCE_BYTES)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("lockfence trigger argument \"resource_prefix\" must be shorter than %d bytes",
							LOCKFENCE_MAX_RESOURCE_BYTES),
					 errdetail("It is %zu bytes; a resource name, the prefix and the column's value, is at most %d bytes.",
							   strlen(config->resource_prefix),
							   LOCKFENCE_MAX_RESOURCE_BYTES)));
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
 *
 * A stale entry no statement comes back for (its trigger or table was
 * dropped, as a session that creates and drops temporary protected tables
 * does all day) is removed when the top transaction ends, with its
 * memory: the hash is keyed by trigger OID, so otherwise every dropped
 * trigger would keep its entry and context for the life of the backend.
 * Not sooner, for the same reason as above: the invalidation may arrive
 * while a statement, or one beneath it, still uses the entry's
 * configuration (fn_extra keeps it for the whole statement).  A kept
 * trigger's entry, removed with the others, is validated again by the next
 * statement, as it would have been anyway.
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
static bool stale_entries = false;	/* any entry may be !valid */

/*
 * The table being validated, and whether an invalidation of it arrived
 * meanwhile (validation reads catalogs, which processes invalidations):
 * then the configuration serves the statement but is not kept as valid.
 */
static Oid	validating_relid = InvalidOid;
static bool validation_invalidated = false;

static void
fence_trigger_invalidate(Datum arg, Oid relid)
{
	HASH_SEQ_STATUS status;
	TriggerConfigEntry *entry;

	if (!OidIsValid(relid) || relid == validating_relid)
		validation_invalidated = true;
	if (trigger_configs == NULL)
		return;
	hash_seq_init(&status, trigger_configs);
	while ((entry = hash_seq_search(&status)) != NULL)
		if (!OidIsValid(relid) || entry->relid == relid)
		{
			entry->valid = false;
			stale_entries = true;
		}
}

/*
 * Remove the stale entries, with their memory, at the end of the top
 * transaction: no statement is running then, so none can still use them.
 */
static void
fence_trigger_remove_stale(void)
{
	HASH_SEQ_STATUS status;
	TriggerConfigEntry *entry;

	hash_seq_init(&status, trigger_configs);
	while ((entry = hash_seq_search(&status)) != NULL)
	{
		if (entry->valid)
			continue;
		if (entry->cxt != NULL)
			MemoryContextDelete(entry->cxt);
		/* removing the entry just returned is allowed during a scan */
		(void) hash_search(trigger_configs, &entry->tgoid, HASH_REMOVE, NULL);
	}
	stale_entries = false;
}

static void
fence_trigger_xact_callback(XactEvent event, void *arg)
{
	ListCell   *lc;

	if (retired_contexts == NIL && !stale_entries)
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
			if (stale_entries)
				fence_trigger_remove_stale();
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
FenceTriggerConfig *
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
		 * first validation fails stays in the table (Valgrind saw the read)
		 * until the transaction ends and removes it, as stale.
		 */
		entry->relid = InvalidOid;
		entry->valid = false;
		entry->cxt = NULL;
		entry->config = NULL;
		stale_entries = true;
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
	validating_relid = RelationGetRelid(rel);
	validation_invalidated = false;
	config = fence_trigger_configure(trigger, rel, cxt);
	validating_relid = InvalidOid;
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
	/* an invalidation that arrived while validating: validate again next */
	entry->valid = !validation_invalidated;
	if (!entry->valid)
		stale_entries = true;
	return config;
}

/*
 * Is funcoid lockfence.fence_trigger()?  (By name in the extension's
 * schema: a replacement of it by other code is check()'s to report.)
 */
bool
lockfence_is_fence_trigger_function(Oid funcoid)
{
	char	   *name = get_func_name(funcoid);

	return name != NULL && strcmp(name, "fence_trigger") == 0 &&
		get_func_namespace(funcoid) == lockfence_schema_oid();
}

/*
 * lockfence.check_trigger(trigger_oid oid)
 *
 * Validate a lockfence trigger, as the extension's event trigger does right
 * after CREATE TRIGGER, so that misuse is reported when it is made.
 *
 * A trigger that does not exist, or whose table was dropped while we
 * waited for its lock, is nothing to validate: no write goes through it.
 * lockfence.check() meets that beside a DROP TABLE, and on Citus beside
 * the deferred cleanup of a moved shard; raising would make it report a
 * trigger that is gone as an invalid one.
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
	relid = HeapTupleIsValid(tgtuple) ?
		((Form_pg_trigger) GETSTRUCT(tgtuple))->tgrelid : InvalidOid;
	systable_endscan(scan);
	table_close(tgrel, AccessShareLock);
	if (!OidIsValid(relid))
		PG_RETURN_VOID();

	rel = try_table_open(relid, AccessShareLock);
	if (rel == NULL)
		PG_RETURN_VOID();
	trigdesc = rel->trigdesc;
	for (i = 0; trigdesc != NULL && i < trigdesc->numtriggers; i++)
	{
		Trigger    *trigger = &trigdesc->triggers[i];

		if (trigger->tgoid != tgoid)
			continue;
		/* judged as lockfence's, another trigger's misuse would be named */
		if (!lockfence_is_fence_trigger_function(trigger->tgfoid))
			ereport(ERROR,
					(errcode(ERRCODE_WRONG_OBJECT_TYPE),
					 errmsg("trigger \"%s\" on table \"%s\" is not a lockfence trigger",
							trigger->tgname, RelationGetRelationName(rel)),
					 errdetail("It executes %s, not lockfence.fence_trigger().",
							   format_procedure(trigger->tgfoid))));
		(void) fence_trigger_configure(trigger, rel, CurrentMemoryContext);
	}
	table_close(rel, AccessShareLock);

	PG_RETURN_VOID();
}
