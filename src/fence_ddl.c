/*-------------------------------------------------------------------------
 *
 * fence_ddl.c
 *	  What the extension's event trigger needs to see of DDL on protected
 *	  tables.
 *
 * Some ALTER TABLE subcommands write rows, or change what a row trigger
 * sees, without firing row triggers: ATTACH PARTITION (rows written while
 * the table was not protected), DETACH PARTITION (drops the cloned row
 * triggers), ALTER COLUMN ... TYPE ... USING (rewrites every row), SET
 * DEFAULT and ADD ... IDENTITY (the database, not the writer, then supplies
 * values).  Which subcommands ran is visible only in C, through the
 * pg_ddl_command values of pg_event_trigger_ddl_commands(); the policy for
 * each is in lockfence.check_new_triggers().
 *
 * IDENTIFICATION
 *	  src/fence_ddl.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_class.h"
#include "fmgr.h"
#include "funcapi.h"
#include "nodes/parsenodes.h"
#include "tcop/deparse_utility.h"
#include "utils/builtins.h"

#include "lockfence.h"

PG_FUNCTION_INFO_V1(lockfence_alter_table_actions);

/*
 * The lockfence name of an ALTER TABLE subcommand that matters to fenced
 * tables, or NULL for one that does not.
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
#if PG_VERSION_NUM < 160000
		case AT_AddColumnRecurse:
#endif
			def = (ColumnDef *) cmd->def;
			if (def != NULL && IsA(def, ColumnDef) &&
				(def->raw_default != NULL || def->cooked_default != NULL ||
				 def->identity != '\0'))
				return "set default";
			return NULL;
		case AT_AlterColumnType:
			def = (ColumnDef *) cmd->def;
			if (def != NULL && IsA(def, ColumnDef) && def->raw_default != NULL)
				return "alter type using";
			return "alter type";
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
 * schema (NULL when not given) and name, for the caller to find.  No rows
 * for other commands.
 */
Datum
lockfence_alter_table_actions(PG_FUNCTION_ARGS)
{
	CollectedCommand *cmd = (CollectedCommand *) PG_GETARG_POINTER(0);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	ListCell   *lc;

	InitMaterializedSRF(fcinfo, 0);
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
