/*-------------------------------------------------------------------------
 *
 * fence_ddl.c
 *	  What the extension's event trigger needs to see of DDL on protected
 *	  tables.
 *
 * Some ALTER TABLE subcommands write rows, or change what a row trigger
 * sees, without firing row triggers: ATTACH PARTITION (rows written while
 * the table was not protected), DETACH PARTITION (drops the cloned row
 * triggers), ALTER COLUMN ... TYPE ... USING (rewrites every row), (1.13,
 * PostgreSQL 17) ALTER COLUMN ... SET EXPRESSION (a generated column of
 * every row recomputed, or, if virtual, read anew), SET
 * DEFAULT and ADD ... IDENTITY (the database, not the writer, then supplies
 * values), and ADD COLUMN (a trigger finds its columns by name: another
 * column under the name would take their place).  So does (1.11) ALTER
 * TYPE ... RENAME VALUE of an enum: every row holding the value reads the
 * new label.  Which subcommands ran is visible only in C, through the
 * pg_ddl_command values of pg_event_trigger_ddl_commands(); the policy
 * for each is in lockfence.check_new_triggers().
 *
 * Those checks, written in SQL, read the catalogs and the rows as of the
 * statement's snapshot.  Under REPEATABLE READ or SERIALIZABLE that is the
 * transaction's, which may predate the table's protection (or a partition
 * attached, a trigger made): the checks would see an unprotected table and
 * let the command through.  lockfence.check_ddl_isolation() looks, with the
 * latest snapshot, at the catalog rows that describe the protected tables
 * a command touches, and refuses the command (40001) when one of them was
 * written by a transaction the snapshot does not see; and ATTACH PARTITION
 * into a protected table, whose check reads the new partition's rows as of
 * the snapshot, is refused there outright (25000).
 *
 * IDENTIFICATION
 *	  src/fence_ddl.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/transam.h"
#include "access/xact.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "nodes/parsenodes.h"
#include "tcop/deparse_utility.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"

#include "fence_owner.h"
#include "lockfence.h"

PG_FUNCTION_INFO_V1(lockfence_alter_table_actions);
PG_FUNCTION_INFO_V1(lockfence_check_ddl_isolation);

/*
 * A major with another number of ALTER TABLE subcommands fails to build
 * here until fence_ddl_action() has been checked against its list
 * (compat.h): a tripwire, which a major that adds one and removes another
 * passes.
 */
#ifdef LF_AT_LAST_REVIEWED
StaticAssertDecl(AT_ReAddStatistics == LF_AT_LAST_REVIEWED,
				 "this PostgreSQL major changed the ALTER TABLE subcommands: check fence_ddl_action() against them, then LF_AT_LAST_REVIEWED in compat.h");
#endif

/*
 * The lockfence name of an ALTER TABLE subcommand that matters to fenced
 * tables, or NULL for one that does not.
 *
 * Every other subcommand leaves the rows' values as they are (a rewrite by
 * SET ACCESS METHOD, SET TABLESPACE or SET LOGGED copies them; the OPTIONS
 * of a foreign table, which can change what its rows read, concern no
 * protected table: lockfence refuses to protect one); what else
 * may weaken a protection (a trigger disabled, a column a trigger names
 * dropped or renamed, inheritance) is judged elsewhere, from the catalogs.
 */
static const char *
fence_ddl_action(AlterTableCmd *cmd)
{
	ColumnDef  *def;

	switch (cmd->subtype)
	{
		case AT_ColumnDefault:
			/* DROP DEFAULT has no expression; it cannot hurt */
			return cmd->def != NULL ? "set default" : NULL;
		case AT_AddIdentity:
			return "add identity";
		case AT_AddColumn:
#ifdef LF_HAVE_AT_RECURSE_VARIANTS
		case AT_AddColumnRecurse:
#endif
			/* its default, and (1.10) its name: not one a trigger names */
			def = (ColumnDef *) cmd->def;
			if (def != NULL && IsA(def, ColumnDef) &&
				(def->raw_default != NULL || def->cooked_default != NULL ||
				 def->identity != '\0'))
				return "add column with default";
			return "add column";
		case AT_AlterColumnType:
			def = (ColumnDef *) cmd->def;
			if (def != NULL && IsA(def, ColumnDef) && def->raw_default != NULL)
				return "alter type using";
			return "alter type";
#ifdef LF_HAVE_AT_SET_EXPRESSION
		case AT_SetExpression:
			/* (1.13) new values for a generated column, every row */
			return "set expression";
#endif
		case AT_AttachPartition:
			return "attach partition";
		case AT_DetachPartition:
		case AT_DetachPartitionFinalize:
			return "detach partition";
		default:
			return NULL;
	}
}

/*
 * lockfence.alter_table_actions(command pg_ddl_command)
 *
 * One row per ALTER TABLE subcommand that matters to fenced tables: the
 * action, and the table (and column, or 0) it acted on: a partition's,
 * when the ALTER recursed.  ATTACH and DETACH do not report the partition
 * they acted on (PostgreSQL 15 leaves its address unset), so for them the
 * table is 0 and the partition is given as it was named in the statement,
 * schema (NULL when not given) and name, for the caller to find.  And
 * (1.11) one row, "rename enum value", for ALTER TYPE ... RENAME VALUE,
 * which changes the rows of every column of the enum's type without
 * firing row triggers (the caller finds them from the type).  No rows for
 * other commands.
 */
Datum
lockfence_alter_table_actions(PG_FUNCTION_ARGS)
{
	CollectedCommand *cmd = (CollectedCommand *) PG_GETARG_POINTER(0);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	ListCell   *lc;

	InitMaterializedSRF(fcinfo, 0);
	if (cmd != NULL && cmd->type == SCT_Simple && cmd->parsetree != NULL &&
		IsA(cmd->parsetree, AlterEnumStmt) &&
		((AlterEnumStmt *) cmd->parsetree)->oldVal != NULL)
	{
		/* (1.11) every row holding the value reads the new label */
		Datum		values[5];
		bool		nulls[5] = {false, false, false, true, true};

		values[0] = CStringGetTextDatum("rename enum value");
		values[1] = ObjectIdGetDatum(InvalidOid);
		values[2] = Int16GetDatum(0);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		return (Datum) 0;
	}
	if (cmd == NULL || cmd->type != SCT_AlterTable)
		return (Datum) 0;

	foreach(lc, cmd->d.alterTable.subcmds)
	{
		CollectedATSubcmd *sub = (CollectedATSubcmd *) lfirst(lc);
		AlterTableCmd *atcmd = (AlterTableCmd *) sub->parsetree;
		const char *action;
		Datum		values[5];
		bool		nulls[5] = {false, false, false, true, true};

		if (atcmd == NULL || !IsA(atcmd, AlterTableCmd))
			continue;
		action = fence_ddl_action(atcmd);
		if (action == NULL)
			continue;

		values[0] = CStringGetTextDatum(action);
		values[1] = ObjectIdGetDatum(InvalidOid);
		values[2] = Int16GetDatum(0);
		if (atcmd->def != NULL && IsA(atcmd->def, PartitionCmd))
		{
			RangeVar   *name = ((PartitionCmd *) atcmd->def)->name;

			if (name->schemaname != NULL)
			{
				values[3] = CStringGetTextDatum(name->schemaname);
				nulls[3] = false;
			}
			values[4] = CStringGetTextDatum(name->relname);
			nulls[4] = false;
		}
		else if (sub->address.classId == RelationRelationId)
		{
			values[1] = ObjectIdGetDatum(sub->address.objectId);
			values[2] = Int16GetDatum((int16) sub->address.objectSubId);
		}
		else
			continue;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}


/*
 * The tables a DDL command touched (relations, the tables of its triggers,
 * the typed tables of a composite type it altered, the tables of a schema
 * it altered), with their inheritance ancestors and descendants: the
 * family.  If one of them is protected (a fence_trigger() trigger, or
 * listed in lockfence.protected_tables: CREATE OR REPLACE TRIGGER may have
 * just replaced the last trigger), the first one's name, whether the
 * command attached a partition, and the xmin of every catalog row that
 * describes the family (its pg_class, pg_attribute, pg_inherits and
 * pg_trigger rows and its rows of lockfence.protected_tables).  Run with
 * the latest snapshot.
 */
#define DDL_FAMILY_SQL \
	"WITH RECURSIVE cmd AS (" \
	"  SELECT c.classid, c.objid, c.command FROM pg_catalog.pg_event_trigger_ddl_commands() AS c)," \
	" touched(rel) AS (" \
	"  SELECT cmd.objid FROM cmd" \
	"   WHERE cmd.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass" \
	"  UNION SELECT t.tgrelid FROM cmd JOIN pg_catalog.pg_trigger AS t" \
	"    ON t.oid OPERATOR(pg_catalog.=) cmd.objid" \
	"   WHERE cmd.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_trigger'::pg_catalog.regclass" \
	"  UNION SELECT r.oid FROM cmd JOIN pg_catalog.pg_class AS r" \
	"    ON r.reloftype OPERATOR(pg_catalog.=) cmd.objid" \
	"   WHERE cmd.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_type'::pg_catalog.regclass" \
	"  UNION SELECT r.oid FROM cmd JOIN pg_catalog.pg_class AS k" \
	"    ON k.oid OPERATOR(pg_catalog.=) cmd.objid AND k.relkind OPERATOR(pg_catalog.=) 'c'" \
	"    JOIN pg_catalog.pg_class AS r ON r.reloftype OPERATOR(pg_catalog.=) k.reltype" \
	"   WHERE cmd.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass" \
	"  UNION SELECT r.oid FROM cmd JOIN pg_catalog.pg_class AS r" \
	"    ON r.relnamespace OPERATOR(pg_catalog.=) cmd.objid AND r.relkind IN ('r', 'p', 'f')" \
	"   WHERE cmd.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass)," \
	" up(rel) AS (SELECT rel FROM touched" \
	"  UNION SELECT i.inhparent FROM pg_catalog.pg_inherits AS i" \
	"    JOIN up ON i.inhrelid OPERATOR(pg_catalog.=) up.rel)," \
	" down(rel) AS (SELECT rel FROM touched" \
	"  UNION SELECT i.inhrelid FROM pg_catalog.pg_inherits AS i" \
	"    JOIN down ON i.inhparent OPERATOR(pg_catalog.=) down.rel)," \
	" family(rel) AS (SELECT rel FROM up UNION SELECT rel FROM down)," \
	" listed AS MATERIALIZED (" \
	"  SELECT lockfence.protected_table_oid(p.tbl) AS rel, p.xmin" \
	"    FROM lockfence.protected_tables AS p)," \
	" protected(rel) AS (SELECT f.rel FROM family AS f" \
	"  WHERE EXISTS (SELECT FROM pg_catalog.pg_trigger AS t" \
	"                 WHERE t.tgrelid OPERATOR(pg_catalog.=) f.rel" \
	"                   AND t.tgfoid OPERATOR(pg_catalog.=) 'lockfence.fence_trigger()'::pg_catalog.regprocedure)" \
	"     OR EXISTS (SELECT FROM listed AS l WHERE l.rel OPERATOR(pg_catalog.=) f.rel))" \
	" SELECT (SELECT p.rel::pg_catalog.regclass::pg_catalog.text FROM protected AS p" \
	"          ORDER BY p.rel LIMIT 1)," \
	"        EXISTS (SELECT FROM cmd, lockfence.alter_table_actions(cmd.command) AS a" \
	"                 WHERE a.action OPERATOR(pg_catalog.=) 'attach partition')," \
	"        ARRAY(SELECT c.xmin FROM pg_catalog.pg_class AS c JOIN family AS f" \
	"                ON c.oid OPERATOR(pg_catalog.=) f.rel" \
	"              UNION ALL SELECT a.xmin FROM pg_catalog.pg_attribute AS a JOIN family AS f" \
	"                ON a.attrelid OPERATOR(pg_catalog.=) f.rel" \
	"              UNION ALL SELECT i.xmin FROM pg_catalog.pg_inherits AS i JOIN family AS f" \
	"                ON f.rel IN (i.inhrelid, i.inhparent)" \
	"              UNION ALL SELECT t.xmin FROM pg_catalog.pg_trigger AS t JOIN family AS f" \
	"                ON t.tgrelid OPERATOR(pg_catalog.=) f.rel" \
	"              UNION ALL SELECT l.xmin FROM listed AS l JOIN family AS f" \
	"                ON l.rel OPERATOR(pg_catalog.=) f.rel)"

/*
 * lockfence.check_ddl_isolation() returns void
 *
 * Called by lockfence's DDL event trigger functions before their checks.
 * Under READ COMMITTED nothing: every statement of the checks takes a new
 * snapshot after the command's own locks.  Under REPEATABLE READ or
 * SERIALIZABLE, for a command touching a protected table's family: a
 * catalog row describing it that the transaction's snapshot does not see
 * (written by a transaction that committed after it) is a serialization
 * failure, since the checks would judge the family as it was; and ATTACH
 * PARTITION is refused, since its check reads the partition's rows as of
 * the snapshot, and rows committed since would not be seen.  A restore or
 * protect() with nothing changed concurrently passes.
 */
Datum
lockfence_check_ddl_isolation(PG_FUNCTION_ARGS)
{
	MemoryContext caller_cxt = CurrentMemoryContext;
	Snapshot	xact_snapshot;
	FenceStoreState state;
	SPIPlanPtr	plan;
	int			rc;
	bool		isnull;
	char	   *protected_rel = NULL;
	bool		attaches = false;
	bool		stale = false;

	if (!IsolationUsesXactSnapshot())
		PG_RETURN_VOID();
	xact_snapshot = GetTransactionSnapshot();

	fence_store_enter(&state);
	plan = SPI_prepare(DDL_FAMILY_SQL, 0, NULL);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for the tables a command touched: %s",
			 SPI_result_code_string(SPI_result));
	rc = SPI_execute_snapshot(plan, NULL, NULL, GetLatestSnapshot(),
							  InvalidSnapshot, true, false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "SPI_execute failed for the tables a command touched: %s",
			 SPI_result_code_string(rc));
	(void) SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (!isnull)
	{
		Datum		xmins;
		ArrayType  *arr;
		Datum	   *elems;
		int			n;

		protected_rel = MemoryContextStrdup(caller_cxt,
											SPI_getvalue(SPI_tuptable->vals[0],
														 SPI_tuptable->tupdesc, 1));
		attaches = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
											  SPI_tuptable->tupdesc, 2, &isnull));
		xmins = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3,
							  &isnull);
		arr = DatumGetArrayTypeP(xmins);
		deconstruct_array(arr, XIDOID, sizeof(TransactionId), true,
						  TYPALIGN_INT, &elems, NULL, &n);
		for (int i = 0; i < n && !stale; i++)
		{
			TransactionId xmin = DatumGetTransactionId(elems[i]);

			stale = TransactionIdIsNormal(xmin) &&
				!TransactionIdIsCurrentTransactionId(xmin) &&
				XidInMVCCSnapshot(xmin, xact_snapshot);
		}
	}
	fence_store_leave(&state);

	if (attaches)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("ATTACH PARTITION into protected table %s must run under READ COMMITTED",
						protected_rel),
				 errdetail("Under %s, lockfence's check of the partition's rows would read them as of the transaction's snapshot, without the rows committed since.",
						   XactIsoLevel == XACT_SERIALIZABLE ? "SERIALIZABLE" : "REPEATABLE READ"),
				 errhint("Attach the partition in a READ COMMITTED transaction.")));
	if (stale)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to a concurrent change of protected table %s",
						protected_rel),
				 errdetail("The table, or one of its partitions, parents or triggers, was changed by a transaction that committed after this transaction's snapshot; lockfence's checks of the command would judge it as it was."),
				 errhint("Retry the transaction, or run the command under READ COMMITTED.")));
	PG_RETURN_VOID();
}
