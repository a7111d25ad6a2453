/*-------------------------------------------------------------------------
 *
 * fuzz_common.h
 *	  What every lockfence fuzz harness shares: a PostgreSQL backend
 *	  without a server, and the one error the parsers may raise.
 *
 * The harnesses are linked with the backend's own object files (those of
 * the assert-enabled build of scripts/pg-assert.sh, less main.o), so the
 * parsers run on the real palloc, ereport, pg_parse_json and jsonb, with
 * assertions and CLOBBER_FREED_MEMORY / MEMORY_CONTEXT_CHECKING on.  No
 * server runs: the harness makes the memory contexts, sets the database
 * encoding to UTF-8 and catches errors with PG_TRY.  lockfence's sources
 * are compiled as they are, with -fsanitize=fuzzer,address,undefined; a
 * harness that needs a file's static functions includes the .c file.
 *
 * What counts as a finding:
 *	- a crash, an ASan or UBSan report, a failed Assert (abort);
 *	- an error other than the one the parsers document for bad input
 *	  (SQLSTATE 08P01, "malformed reply from etcd", unless the harness
 *	  says otherwise): fuzz_expect_error() aborts on it;
 *	- any WARNING (a write past a palloc'd chunk, found by the memory
 *	  context checks when the iteration's context is reset, is one);
 *	- an iteration that leaves the memory context it ran in (every
 *	  iteration runs in a fresh child of TopMemoryContext, reset after).
 *
 * IDENTIFICATION
 *	  fuzz/fuzz_common.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef LOCKFENCE_FUZZ_COMMON_H
#define LOCKFENCE_FUZZ_COMMON_H

#include "postgres.h"

#include <stdio.h>
#include <stdlib.h>

#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/elog.h"
#include "utils/memutils.h"

/* main.c is not linked; elog.c and others refer to it. */
const char *progname = "lockfence-fuzz";

/* The lock the seed corpora were captured with (fuzz/capture-seeds.sh). */
#define FUZZ_LEASE		INT64CONST(7587869521853040000)
#define FUZZ_KEY		"lf/fuzz/694d8720bc104580"
#define FUZZ_KEY_B64	"bGYvZnV6ei82OTRkODcyMGJjMTA0NTgw"
#define FUZZ_PREFIX_B64	"bGYvZnV6ei8="
#define FUZZ_PREFIX_END_B64	"bGYvZnV6ejA="
#define FUZZ_ENDPOINT	"http://127.0.0.1:2379"

static MemoryContext fuzz_cxt = NULL;

static void
fuzz_emit_log_hook(ErrorData *edata)
{
	/* LOG and DEBUG are fine; a WARNING or worse that got out is not. */
	if (edata->elevel == WARNING || edata->elevel >= ERROR)
	{
		fprintf(stderr, "lockfence-fuzz: unexpected %s: %s\n",
				edata->elevel == WARNING ? "WARNING" : "ERROR",
				edata->message ? edata->message : "(no message)");
		abort();
	}
}

static void
fuzz_init(void)
{
	if (fuzz_cxt != NULL)
		return;
	MemoryContextInit();
	/* check_stack_depth() as in a backend (max_stack_depth 100kB) */
	(void) set_stack_base();
	SetDatabaseEncoding(PG_UTF8);
	emit_log_hook = fuzz_emit_log_hook;
	fuzz_cxt = AllocSetContextCreate(TopMemoryContext, "lockfence fuzz",
									 ALLOCSET_DEFAULT_SIZES);
}

/* Start an iteration: run in the iteration's context. */
static void
fuzz_begin(void)
{
	fuzz_init();
	MemoryContextSwitchTo(fuzz_cxt);
}

/*
 * End an iteration: everything palloc'd in it is freed (and checked for
 * writes past the end of its chunk).
 */
static void
fuzz_end(void)
{
	MemoryContextSwitchTo(TopMemoryContext);
	MemoryContextReset(fuzz_cxt);
}

/*
 * In a PG_CATCH block: the error must carry sqlstate (0: any error is a
 * finding).  Clears the error state.
 */
static void
fuzz_expect_error(int sqlstate)
{
	ErrorData  *edata;

	MemoryContextSwitchTo(fuzz_cxt);
	edata = CopyErrorData();
	FlushErrorState();
	if (sqlstate == 0 || edata->sqlerrcode != sqlstate)
	{
		fprintf(stderr, "lockfence-fuzz: unexpected error (SQLSTATE %s): %s\n",
				unpack_sql_state(edata->sqlerrcode),
				edata->message ? edata->message : "(no message)");
		abort();
	}
}

/* A palloc'd, NUL-terminated copy of the input. */
static char *
fuzz_cstring(const uint8_t *data, size_t size)
{
	char	   *s = palloc(size + 1);

	memcpy(s, data, size);
	s[size] = '\0';
	return s;
}

#define FUZZ_CHECK(cond) \
	do { \
		if (!(cond)) \
		{ \
			fprintf(stderr, "lockfence-fuzz: check failed at %s:%d: %s\n", \
					__FILE__, __LINE__, #cond); \
			abort(); \
		} \
	} while (0)

#endif							/* LOCKFENCE_FUZZ_COMMON_H */
