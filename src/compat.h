/*-------------------------------------------------------------------------
 *
 * compat.h
 *	  The one place where lockfence deals with differences between the
 *	  PostgreSQL majors it supports (15, 16, 17, 18).
 *
 * Every API that changed between those majors is wrapped here behind one
 * name, with PG_VERSION_NUM guards; the rest of the code calls the wrapper
 * and never tests the version itself.  16 sits between 15 and 17 for all of
 * these (the 17 changes are new in 17), so it takes the 15 branch.
 *
 * IDENTIFICATION
 *	  src/compat.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_COMPAT_H
#define LOCKFENCE_COMPAT_H

#include "postgres.h"

#include "access/genam.h"
#include "access/tableam.h"
#include "common/base64.h"
#include "common/jsonapi.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/relcache.h"
#include "utils/resowner.h"

#if PG_VERSION_NUM < 150000
#error "lockfence needs PostgreSQL 15 or later"
#endif

/*
 * A function that never returns: 18 removed pg_attribute_noreturn() (which
 * went after the declaration) in favour of pg_noreturn (which goes before
 * it).  GCC and Clang accept the attribute in front as well, so older
 * majors get pg_noreturn spelt with the old attribute.
 */
#ifndef pg_noreturn
#define pg_noreturn pg_attribute_noreturn()
#endif

/*
 * A WaitEventSet for nevents events.  Since 17 the set is tracked by a
 * resource owner (released with it on error) instead of being allocated in
 * a memory context; before 17 it lives in CurrentMemoryContext.  Callers
 * free it with FreeWaitEventSet() either way.
 */
#if PG_VERSION_NUM >= 170000
#define lf_create_wait_event_set(nevents) \
	CreateWaitEventSet(CurrentResourceOwner, (nevents))
#else
#define lf_create_wait_event_set(nevents) \
	CreateWaitEventSet(CurrentMemoryContext, (nevents))
#endif

/*
 * Does this transaction hold a lock of exactly this mode?  17 added
 * "orstronger"; false keeps the meaning of the older two-argument call.
 */
#if PG_VERSION_NUM >= 170000
#define lf_lock_held_by_me(tag, mode) LockHeldByMe((tag), (mode), false)
#else
#define lf_lock_held_by_me(tag, mode) LockHeldByMe((tag), (mode))
#endif

/*
 * A JSON lexer over json[0..len).  Since 17 the caller may pass a
 * JsonLexContext to fill; NULL makes it palloc one, as before 17.
 */
#if PG_VERSION_NUM >= 170000
#define lf_make_json_lex_context(json, len, encoding, need_escapes) \
	makeJsonLexContextCstringLen(NULL, (json), (len), (encoding), (need_escapes))
#else
#define lf_make_json_lex_context(json, len, encoding, need_escapes) \
	makeJsonLexContextCstringLen((json), (len), (encoding), (need_escapes))
#endif

/*
 * Base64 of bytes: 18 declares the binary side as uint8 instead of char.
 */
#if PG_VERSION_NUM >= 180000
#define lf_b64_encode(src, len, dst, dstlen) \
	pg_b64_encode((const uint8 *) (src), (len), (dst), (dstlen))
#define lf_b64_decode(src, len, dst, dstlen) \
	pg_b64_decode((src), (len), (uint8 *) (dst), (dstlen))
#else
#define lf_b64_encode(src, len, dst, dstlen) \
	pg_b64_encode((src), (len), (dst), (dstlen))
#define lf_b64_decode(src, len, dst, dstlen) \
	pg_b64_decode((src), (len), (dst), (dstlen))
#endif

/*
 * The relation's primary key index.  18 asks whether a deferrable one will
 * do; before 18 a deferrable primary key was never returned, so: no.
 */
#if PG_VERSION_NUM >= 180000
#define lf_primary_key_index(rel) RelationGetPrimaryKeyIndex((rel), false)
#else
#define lf_primary_key_index(rel) RelationGetPrimaryKeyIndex(rel)
#endif

/*
 * Start an index scan.  18 added an instrumentation argument (NULL: none).
 */
#if PG_VERSION_NUM >= 180000
#define lf_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), (norderbys))
#else
#define lf_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), (nkeys), (norderbys))
#endif

/*
 * Update a row version with the new one in slot, waiting for lockers; sets
 * *update_index when every index needs an entry for the new version (not a
 * HOT update).  16 replaced the bool with TU_UpdateIndexes, whose
 * TU_Summarizing concerns only summarizing indexes (BRIN).
 */
static inline TM_Result
lf_table_tuple_update(Relation rel, ItemPointer otid, TupleTableSlot *slot,
					  CommandId cid, Snapshot snapshot, TM_FailureData *tmfd,
					  bool *update_index)
{
	LockTupleMode lockmode;
#if PG_VERSION_NUM >= 160000
	TU_UpdateIndexes update_indexes;
	TM_Result	result;

	result = table_tuple_update(rel, otid, slot, cid, snapshot, InvalidSnapshot,
								true, tmfd, &lockmode, &update_indexes);
	*update_index = update_indexes == TU_All;
	return result;
#else
	return table_tuple_update(rel, otid, slot, cid, snapshot, InvalidSnapshot,
							  true, tmfd, &lockmode, update_index);
#endif
}

/*
 * A GUC check hook's extra data is freed by the GUC machinery: with free()
 * before 16, with guc_free() (a pfree in the GUC memory context) from 16
 * on, so it must come from the matching allocator.
 */
#if PG_VERSION_NUM >= 160000
#define lf_guc_malloc(size) guc_malloc(LOG, (size))
#define lf_guc_free(ptr) guc_free(ptr)
#else
#define lf_guc_malloc(size) malloc(size)
#define lf_guc_free(ptr) free(ptr)
#endif

/*
 * May roleid execute function funcoid?  16 replaced pg_proc_aclcheck with
 * the catalog-generic object_aclcheck.
 */
#if PG_VERSION_NUM >= 160000
#define lf_proc_aclcheck(funcoid, roleid, mode) \
	object_aclcheck(ProcedureRelationId, (funcoid), (roleid), (mode))
#else
#define lf_proc_aclcheck(funcoid, roleid, mode) \
	pg_proc_aclcheck((funcoid), (roleid), (mode))
#endif

/*
 * Pin the shared buffer recent_buffer if it still holds block blkno of
 * rel's main fork: no buffer mapping look-up, and no read.  16 renamed
 * the relation's RelFileNode to RelFileLocator.
 */
#if PG_VERSION_NUM >= 160000
#define lf_read_recent_buffer(rel, blkno, recent_buffer) \
	ReadRecentBuffer((rel)->rd_locator, MAIN_FORKNUM, (blkno), (recent_buffer))
#else
#define lf_read_recent_buffer(rel, blkno, recent_buffer) \
	ReadRecentBuffer((rel)->rd_node, MAIN_FORKNUM, (blkno), (recent_buffer))
#endif

/*
 * ALTER TABLE subcommands.  fence_ddl_action() (fence_ddl.c) names those
 * that write rows without firing row triggers; a subcommand it does not
 * know passes unchecked (17's SET EXPRESSION did, until 1.13).  So the
 * number of the last one, AT_ReAddStatistics, is pinned for each major the
 * list was read against, and a major whose list is longer or shorter fails
 * to build until fence_ddl_action() has been checked against it.  16
 * (15's list without the five Recurse variants) is not built here, so it
 * is not pinned.
 */
#if PG_VERSION_NUM >= 180000
#define LF_AT_LAST_REVIEWED 65		/* 17's without AT_CheckNotNull */
#elif PG_VERSION_NUM >= 170000
#define LF_AT_LAST_REVIEWED 66
#elif PG_VERSION_NUM < 160000
#define LF_AT_LAST_REVIEWED 70
#endif
#if PG_VERSION_NUM >= 170000
#define LF_HAVE_AT_SET_EXPRESSION 1
#endif
#if PG_VERSION_NUM < 160000
#define LF_HAVE_AT_RECURSE_VARIANTS 1
#endif

#endif							/* LOCKFENCE_COMPAT_H */
