/*-------------------------------------------------------------------------
 *
 * fence_shape.c
 *	  Is lockfence.fences exactly as the install scripts make it?
 *
 * The fast paths (fence_fastpath.c) read and write fence rows without the
 * executor: they read the columns at fixed attribute numbers, and a lease
 * written there satisfies the table's constraints only by construction.
 * That is right only for the table the install scripts create: the same
 * columns at the same attribute numbers, with the same types, typmods,
 * collations and NOT NULL markings, the same CHECK constraints and primary
 * key, and nothing the executor would do besides (triggers, rules, other
 * indexes, row-level security, inheritance).  The table's owner may change
 * any of that; then every check and lease goes through the statements in
 * fence_store.c and lease.c, which name the columns and let the executor
 * enforce what the owner added.
 *
 * The verdict is computed once and kept until a relcache invalidation of
 * the table or its primary key (any DDL on them sends one), so the fast
 * paths pay a comparison of OIDs per call.
 *
 * lockfence.fences_table_problem() shows the verdict to SQL (for
 * lockfence.check()).
 *
 * IDENTIFICATION
 *	  src/fence_shape.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/heap.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_constraint.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_rewrite.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/relcache.h"

#include "citus_guard.h"
#include "fence_fastpath.h"
#include "lockfence.h"
#include "lockfence_schema.h"
#include "relcache_callbacks.h"

PG_FUNCTION_INFO_V1(lockfence_fences_table_problem);

/*
 * The columns of lockfence.fences, in attribute number order: 1.0 created
 * the first four, 1.2 added the lease columns (a library may serve a
 * database still at 1.0 or 1.1).
 */
typedef struct FencesColumn
{
	const char *name;
	Oid			type;
	bool		notnull;
} FencesColumn;

static const FencesColumn fences_columns[] = {
	{"resource", TEXTOID, true},
	{"token", INT8OID, true},
	{"accepted_at", TIMESTAMPTZOID, true},
	{"holder", TEXTOID, false},
	{"lease_expires_at", TIMESTAMPTZOID, false},
	{"lease_ttl", INTERVALOID, false},
};

#define FENCES_NATTS_BEFORE_LEASES	4
#define FENCES_NATTS				lengthof(fences_columns)

/*
 * The CHECK constraints of lockfence.fences as pg_get_constraintdef shows
 * them with search_path = pg_catalog (the same on every supported major).
 */
static const char *const fences_checks[] = {
	"CHECK (((resource <> ''::text) AND (octet_length(resource) <= 255)))",
	"CHECK ((token >= 0))",
};

/* The verdict, for the table and primary key index it was computed for. */
static Oid	shape_relid = InvalidOid;
static Oid	shape_indexid = InvalidOid;
static bool shape_valid = false;
static char *shape_problem = NULL;	/* NULL: intact; in TopMemoryContext */

/* Bumped by every invalidation, so a verdict computed meanwhile is dropped. */
static uint64 shape_invalidations = 0;
static bool shape_callback_registered = false;

static void
fence_shape_invalidate(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || relid == shape_relid || relid == shape_indexid)
	{
		shape_valid = false;
		shape_invalidations++;
	}
}

/* The columns: names and attribute numbers, types, NOT NULL, defaults. */
static char *
fence_shape_columns(Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			natts = desc->natts;

	for (int i = 0; i < natts && i < (int) FENCES_NATTS; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		const FencesColumn *col = &fences_columns[i];

		if (att->attisdropped)
			return psprintf("Column %d of lockfence.fences (\"%s\" as installed) was dropped.",
							i + 1, col->name);
		if (strcmp(NameStr(att->attname), col->name) != 0)
			return psprintf("Column %d of lockfence.fences is \"%s\", not \"%s\" as installed.",
							i + 1, NameStr(att->attname), col->name);
		if (att->atttypid != col->type || att->atttypmod != -1)
			return psprintf("Column \"%s\" of lockfence.fences has type %s, not %s as installed.",
							col->name,
							format_type_with_typemod(att->atttypid, att->atttypmod),
							format_type_be(col->type));
		if (col->type == TEXTOID && att->attcollation != DEFAULT_COLLATION_OID)
			return psprintf("Column \"%s\" of lockfence.fences has collation \"%s\", not the database default as installed.",
							col->name, get_collation_name(att->attcollation));
		if (att->attnotnull != col->notnull)
			return psprintf(col->notnull ?
							"Column \"%s\" of lockfence.fences may be null, unlike as installed." :
							"Column \"%s\" of lockfence.fences is NOT NULL, unlike as installed.",
							col->name);
		if (att->atthasdef)
			return psprintf("Column \"%s\" of lockfence.fences has a default, unlike as installed.",
							col->name);
		if (att->attgenerated != '\0' || att->attidentity != '\0')
			return psprintf("Column \"%s\" of lockfence.fences is generated or an identity column, unlike as installed.",
							col->name);
		if (att->attinhcount != 0)
			return psprintf("Column \"%s\" of lockfence.fences is inherited from another table.",
							col->name);
	}
	for (int i = FENCES_NATTS; i < natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		return psprintf(att->attisdropped ?
						"lockfence.fences has column \"%s\" (dropped) that the install scripts do not create." :
						"lockfence.fences has column \"%s\" that the install scripts do not create.",
						NameStr(att->attname));
	}
	if (natts != FENCES_NATTS_BEFORE_LEASES && natts != (int) FENCES_NATTS)
		return psprintf("lockfence.fences lacks column \"%s\".",
						fences_columns[natts].name);
	return NULL;
}

/*
 * The deparsed definition of a constraint, independent of the caller's
 * search_path and quote_all_identifiers.
 */
static char *
fence_shape_constraint_def(Oid conoid)
{
	int			nestlevel = NewGUCNestLevel();
	char	   *def;

	(void) set_config_option("search_path", "pg_catalog", PGC_USERSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	(void) set_config_option("quote_all_identifiers", "off", PGC_USERSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	def = TextDatumGetCString(DirectFunctionCall1(pg_get_constraintdef,
												  ObjectIdGetDatum(conoid)));
	AtEOXact_GUC(true, nestlevel);
	return def;
}

/*
 * The constraints: the primary key on resource (not deferrable) and the
 * two CHECK constraints, validated and inheritable.  NOT NULL constraints
 * (catalogued from PostgreSQL 18 on) are judged by the columns.
 */
static char *
fence_shape_constraints(Relation rel, Oid *pkey_index)
{
	Relation	conrel = table_open(ConstraintRelationId, AccessShareLock);
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	bool		seen_check[lengthof(fences_checks)] = {false};
	char	   *problem = NULL;

	*pkey_index = InvalidOid;
	ScanKeyInit(&key, Anum_pg_constraint_conrelid, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(RelationGetRelid(rel)));
	scan = systable_beginscan(conrel, ConstraintRelidTypidNameIndexId, true,
							  NULL, 1, &key);
	while (problem == NULL && HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		Form_pg_constraint con = (Form_pg_constraint) GETSTRUCT(tuple);
		const char *name = NameStr(con->conname);

		if (con->contype == CONSTRAINT_PRIMARY)
		{
			/* its index is judged by fence_shape_pkey_index */
			if (con->condeferrable)
				problem = psprintf("The primary key \"%s\" of lockfence.fences is deferrable, unlike as installed.",
								   name);
			else
				*pkey_index = con->conindid;
		}
		else if (con->contype == CONSTRAINT_CHECK)
		{
			char	   *def = fence_shape_constraint_def(con->oid);
			int			i;

			for (i = 0; i < (int) lengthof(fences_checks); i++)
				if (!seen_check[i] && strcmp(def, fences_checks[i]) == 0)
					break;
			if (i == lengthof(fences_checks) || !con->convalidated ||
				con->connoinherit)
				problem = psprintf("lockfence.fences has CHECK constraint \"%s\" (%s) that the install scripts do not create.",
								   name, def);
			else
				seen_check[i] = true;
		}
		else if (con->contype != 'n')	/* CONSTRAINT_NOTNULL (18 on) */
			problem = psprintf("lockfence.fences has constraint \"%s\" that the install scripts do not create.",
							   name);
	}
	systable_endscan(scan);
	table_close(conrel, AccessShareLock);

	if (problem != NULL)
		return problem;
	if (!OidIsValid(*pkey_index))
		return pstrdup("lockfence.fences has no primary key on resource.");
	for (int i = 0; i < (int) lengthof(fences_checks); i++)
		if (!seen_check[i])
			return psprintf("lockfence.fences lacks the constraint %s that the install scripts create.",
							fences_checks[i]);
	return NULL;
}

/* The primary key's index: a plain btree on resource with default opclass. */
static char *
fence_shape_pkey_index(Oid indexid)
{
	Relation	index = index_open(indexid, AccessShareLock);
	Form_pg_index ind = index->rd_index;
	char	   *problem = NULL;

	if (index->rd_rel->relam != BTREE_AM_OID || !ind->indisunique ||
		!ind->indisprimary || !ind->indimmediate || !ind->indisvalid ||
		!ind->indisready || ind->indnatts != 1 || ind->indnkeyatts != 1 ||
		ind->indkey.values[0] != 1 ||
		RelationGetIndexExpressions(index) != NIL ||
		RelationGetIndexPredicate(index) != NIL ||
		index->rd_opfamily[0] !=
		get_opclass_family(GetDefaultOpClass(TEXTOID, BTREE_AM_OID)) ||
		index->rd_indcollation[0] != DEFAULT_COLLATION_OID)
		problem = psprintf("The primary key index \"%s\" of lockfence.fences is not a plain btree index on resource as installed.",
						   RelationGetRelationName(index));
	index_close(index, AccessShareLock);
	return problem;
}

/* The rule of name first in pg_rewrite for the table. */
static char *
fence_shape_rule_name(Oid relid)
{
	Relation	rwrel = table_open(RewriteRelationId, AccessShareLock);
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	char	   *name = NULL;

	ScanKeyInit(&key, Anum_pg_rewrite_ev_class, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(relid));
	scan = systable_beginscan(rwrel, RewriteRelRulenameIndexId, true, NULL,
							  1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
		name = pstrdup(NameStr(((Form_pg_rewrite) GETSTRUCT(tuple))->rulename));
	systable_endscan(scan);
	table_close(rwrel, AccessShareLock);
	return name ? name : pstrdup("?");
}

/*
 * What differs between rel and lockfence.fences as installed, as a
 * sentence, or NULL.  The first difference found is named.
 */
static char *
fence_shape_compute(Relation rel, Oid *pkey_index)
{
	Form_pg_class form = rel->rd_rel;
	Oid			relid = RelationGetRelid(rel);
	char	   *problem;
	List	   *indexes;
	List	   *children;
	ListCell   *lc;

	*pkey_index = InvalidOid;
	if (form->relkind != RELKIND_RELATION)
		return pstrdup("lockfence.fences is not an ordinary table.");
	if (form->relam != HEAP_TABLE_AM_OID)
		return pstrdup("lockfence.fences does not use the heap table access method.");
	if (form->relpersistence != RELPERSISTENCE_PERMANENT)
		return pstrdup("lockfence.fences is not a logged table.");
	if (form->relispartition)
		return pstrdup("lockfence.fences is a partition of another table.");

	if ((problem = fence_shape_columns(rel)) != NULL)
		return problem;
	if ((problem = fence_shape_constraints(rel, pkey_index)) != NULL)
		return problem;

	indexes = RelationGetIndexList(rel);
	foreach(lc, indexes)
	{
		if (lfirst_oid(lc) != *pkey_index)
			return psprintf("lockfence.fences has index \"%s\" that the install scripts do not create.",
							get_rel_name(lfirst_oid(lc)));
	}
	if (list_length(indexes) != 1)
		return pstrdup("lockfence.fences has no primary key index.");
	if ((problem = fence_shape_pkey_index(*pkey_index)) != NULL)
		return problem;

	if (rel->trigdesc != NULL && rel->trigdesc->numtriggers > 0)
		return psprintf("lockfence.fences has trigger \"%s\" that the install scripts do not create.",
						rel->trigdesc->triggers[0].tgname);
	if (form->relhasrules)
		return psprintf("lockfence.fences has rule \"%s\" that the install scripts do not create.",
						fence_shape_rule_name(relid));
	if (form->relrowsecurity || form->relforcerowsecurity)
		return pstrdup("Row-level security is enabled on lockfence.fences, unlike as installed.");

	children = find_inheritance_children(relid, NoLock);
	if (children != NIL)
		return psprintf("lockfence.fences has child table \"%s\".",
						get_rel_name(linitial_oid(children)));
	return NULL;
}

/*
 * What differs between rel (lockfence.fences, opened by the caller) and
 * the table as installed: NULL when nothing does, else a sentence naming
 * the first difference.  Computed once per change of the table.
 */
const char *
fences_table_problem(Relation rel)
{
	Oid			relid = RelationGetRelid(rel);

	if (!shape_callback_registered)
	{
		lockfence_relcache_register(fence_shape_invalidate);
		shape_callback_registered = true;
	}

	if (!shape_valid || shape_relid != relid)
	{
		uint64		invalidations = shape_invalidations;
		Oid			pkey_index;
		char	   *problem;

		/* Until recomputed, no verdict: an invalidation of rel counts. */
		shape_valid = false;
		shape_relid = relid;
		if (shape_problem != NULL)
		{
			pfree(shape_problem);
			shape_problem = NULL;
		}

		problem = fence_shape_compute(rel, &pkey_index);
		shape_indexid = pkey_index;
		if (problem != NULL)
			shape_problem = MemoryContextStrdup(TopMemoryContext, problem);
		/* Keep it only if no invalidation arrived while computing. */
		shape_valid = invalidations == shape_invalidations;
	}
	return shape_problem;
}

/*
 * A number that changes with every relcache invalidation of the table
 * fences_table_problem was last asked about (or of its primary key, or of
 * every relation): what the fast path keeps about that table (its OID, the
 * TID of a row version) is good while the number is the same.  Asked
 * about a table, fences_table_problem has registered the callback.
 */
uint64
fences_table_invalidations(void)
{
	return shape_invalidations;
}

/*
 * lockfence.fences_table_problem() returns text
 *
 * NULL when lockfence.fences is exactly as the install scripts make it,
 * else a sentence naming what differs.  Then fences and leases go through
 * SQL statements, which the executor checks against the table as it is.
 *
 * Distributed by Citus (lockfence.citus_distribute()), the table here is
 * a shell that Citus gives a truncate trigger of its own and lockfence
 * never reads: fences are read and written in the shards (citus_fences.c),
 * each judged as the fast path opens it.  The shell is not judged.
 */
Datum
lockfence_fences_table_problem(PG_FUNCTION_ARGS)
{
	Oid			relid = lockfence_relid("fences");
	Relation	rel;
	const char *problem;
	text	   *result = NULL;

	if (!OidIsValid(relid))
		PG_RETURN_TEXT_P(cstring_to_text("lockfence.fences does not exist."));
	if (lockfence_citus_fences_distributed())
		PG_RETURN_NULL();
	rel = table_open(relid, AccessShareLock);
	problem = fences_table_problem(rel);
	if (problem != NULL)
		result = cstring_to_text(problem);
	table_close(rel, AccessShareLock);
	if (result == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(result);
}
