/*-------------------------------------------------------------------------
 *
 * metrics.c
 *	  Cluster-wide counters, histograms and a top list of rejected
 *	  resources, their SQL functions, and the rejection log.
 *
 * The metrics live in one struct in shared memory, set aside when the
 * library is in shared_preload_libraries.  Plain counters and histogram
 * buckets are atomics, so counting an event never waits; only the top list
 * of resources with rejected tokens is guarded by an LWLock, and rejections
 * are the rare path.  Counters are not transactional: an accepted check
 * counts even if its transaction later rolls back.
 *
 * Without preloading the fence works as before: the counting functions do
 * nothing, the rejection log still works, and the SQL functions that read
 * the metrics raise an error that says how to enable them.
 *
 * IDENTIFICATION
 *	  src/metrics.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "floor_state.h"
#include "lockfence.h"
#include "metrics.h"
#include "shmem_hooks.h"

PG_FUNCTION_INFO_V1(lockfence_read_metrics);
PG_FUNCTION_INFO_V1(lockfence_read_rejections);
PG_FUNCTION_INFO_V1(lockfence_read_histograms);
PG_FUNCTION_INFO_V1(lockfence_reset_metrics);
#ifdef LOCKFENCE_TEST_HOOKS
PG_FUNCTION_INFO_V1(lockfence_metrics_test_event);
#endif

/* The plain counters, in the order lockfence.metrics lists them. */
typedef enum LockfenceCounter
{
	LFC_FENCE_ACCEPTED,
	LFC_REJECTED_STALE,
	LFC_REJECTED_HOLDER_CONFLICT,
	LFC_REJECTED_MISSING_TOKEN,
	LFC_PROCEEDED_WITHOUT_LOCK,
	LFC_ACQUIRED,
	LFC_ACQUIRE_ERRORS,
	LFC_RESOURCES_EVICTED,
	LFC_REJECTED_LEASE_LOST,
	LFC_LEASE_ACQUIRED,
	LFC_LEASE_ACQUIRE_ERRORS,
	LFC_LEASE_EXPIRED_TAKEN_OVER,
	LFC_NUM_COUNTERS
} LockfenceCounter;

static const char *const counter_names[LFC_NUM_COUNTERS] = {
	"fence_accepted_total",
	"fence_rejected_stale_total",
	"fence_rejected_holder_conflict_total",
	"write_rejected_missing_token_total",
	"proceeded_without_lock_total",
	"lock_acquire_total",
	"lock_acquire_error_total",
	"rejection_resources_evicted_total",
	"fence_rejected_lease_lost_total",
	"lease_acquire_total",
	"lease_acquire_error_total",
	"lease_expired_taken_over_total"
};

/* The histograms, with their fixed upper bounds (seconds, +Inf implied). */
typedef enum LockfenceHistogram
{
	LFH_ACQUIRE_DURATION,
	LFH_HOLD_DURATION,
	LFH_LEASE_ACQUIRE_DURATION,
	LFH_LEASE_HOLD_DURATION,
	LFH_NUM_HISTOGRAMS
} LockfenceHistogram;

#define LF_MAX_BOUNDS	16

typedef struct HistogramDef
{
	const char *name;
	int			nbounds;
	double		bounds[LF_MAX_BOUNDS];
} HistogramDef;

static const HistogramDef histogram_defs[LFH_NUM_HISTOGRAMS] = {
	{"lock_acquire_duration_seconds", 13,
	{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}},
	{"lock_hold_duration_seconds", 12,
	{0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600}},
	/* the same for leases (lease.c), with the same bounds */
	{"lease_acquire_duration_seconds", 13,
	{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}},
	{"lease_hold_duration_seconds", 12,
	{0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600}}
};

/*
 * A histogram in shared memory.  buckets[i] counts the observations that
 * fell into bucket i alone (the last one is +Inf); readers add them up into
 * Prometheus' cumulative "le" buckets, so the +Inf bucket always equals the
 * count.  The sum is kept in whole nanoseconds so that it can be atomic.
 */
typedef struct SharedHistogram
{
	pg_atomic_uint64 buckets[LF_MAX_BOUNDS + 1];
	pg_atomic_uint64 sum_ns;
} SharedHistogram;

/* One resource of the top list of rejected resources. */
typedef struct RejectedResource
{
	char		resource[LOCKFENCE_MAX_RESOURCE_BYTES + 1];
	uint64		rejections;
	int64		last_token;		/* the token last rejected */
	int64		highest;		/* the highest accepted, at that time */
	TimestampTz last_at;
} RejectedResource;

typedef struct LockfenceMetricsShared
{
	LWLock	   *lock;			/* guards nresources and resources[] */
	pg_atomic_uint64 counters[LFC_NUM_COUNTERS];
	SharedHistogram histograms[LFH_NUM_HISTOGRAMS];
	int			nresources;
	RejectedResource resources[LOCKFENCE_METRICS_TOP_RESOURCES];
} LockfenceMetricsShared;

/*
 * Values of lockfence.log_rejections; 0 is "off".  "log" is
 * LOG_SERVER_ONLY: a session that sets client_min_messages = log gets no
 * copy (the docs promise the server log only; info and above reach the
 * client).
 */
#define LF_LOG_OFF	0

static const struct config_enum_entry log_rejections_options[] = {
	{"debug5", DEBUG5, false},
	{"debug4", DEBUG4, false},
	{"debug3", DEBUG3, false},
	{"debug2", DEBUG2, false},
	{"debug1", DEBUG1, false},
	{"debug", DEBUG2, true},
	{"log", LOG_SERVER_ONLY, false},
	{"info", INFO, false},
	{"notice", NOTICE, false},
	{"warning", WARNING, false},
	{"off", LF_LOG_OFF, false},
	{NULL, 0, false}
};

static int	lockfence_log_rejections = LOG_SERVER_ONLY;

/* NULL unless the library was preloaded. */
static LockfenceMetricsShared *lf_metrics = NULL;

/*
 * Define lockfence.log_rejections.  Called from _PG_init.  (The shared
 * memory is asked for by shmem_hooks.c, when the library is being preloaded.)
 */
void
lockfence_metrics_init(void)
{
	DefineCustomEnumVariable("lockfence.log_rejections",
							 gettext_noop("Message level at which rejected fencing tokens and writes are logged."),
							 gettext_noop("Each rejection is logged once with the resource, the tokens, "
										  "application_name and the backend's process ID; \"off\" disables it."),
							 &lockfence_log_rejections,
							 LOG_SERVER_ONLY,
							 log_rejections_options,
							 PGC_SUSET,
							 0,
							 NULL, NULL, NULL);
}

/*
 * shmem_request_hook (shmem_hooks.c): reserve the metrics struct and one LWLock.
 */
void
lockfence_metrics_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(LockfenceMetricsShared)));
	RequestNamedLWLockTranche("lockfence", 1);
}

/*
 * Zero all metrics.  The caller holds the lock exclusively.
 */
static void
lockfence_metrics_zero(LockfenceMetricsShared *m)
{
	int			i;
	int			h;

	for (i = 0; i < LFC_NUM_COUNTERS; i++)
		pg_atomic_write_u64(&m->counters[i], 0);
	for (h = 0; h < LFH_NUM_HISTOGRAMS; h++)
	{
		for (i = 0; i <= LF_MAX_BOUNDS; i++)
			pg_atomic_write_u64(&m->histograms[h].buckets[i], 0);
		pg_atomic_write_u64(&m->histograms[h].sum_ns, 0);
	}
	m->nresources = 0;
}

/*
 * shmem_startup_hook (shmem_hooks.c): create or attach to the metrics struct.
 */
void
lockfence_metrics_shmem_startup(void)
{
	LockfenceMetricsShared *m;
	bool		found;
	int			i;
	int			h;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	m = ShmemInitStruct("lockfence metrics", sizeof(LockfenceMetricsShared),
						&found);
	if (!found)
	{
		m->lock = &(GetNamedLWLockTranche("lockfence"))->lock;
		for (i = 0; i < LFC_NUM_COUNTERS; i++)
			pg_atomic_init_u64(&m->counters[i], 0);
		for (h = 0; h < LFH_NUM_HISTOGRAMS; h++)
		{
			for (i = 0; i <= LF_MAX_BOUNDS; i++)
				pg_atomic_init_u64(&m->histograms[h].buckets[i], 0);
			pg_atomic_init_u64(&m->histograms[h].sum_ns, 0);
		}
		m->nresources = 0;
	}
	LWLockRelease(AddinShmemInitLock);

	lf_metrics = m;
}

/*
 * Add one to a counter, if there are counters.
 */
static inline void
lockfence_count(LockfenceCounter counter)
{
	if (lf_metrics != NULL)
		pg_atomic_fetch_add_u64(&lf_metrics->counters[counter], 1);
}

/*
 * Record one observation of seconds in a histogram.  Negative and NaN
 * values count as zero: a clock step must not lose the event.
 */
static void
lockfence_observe(LockfenceHistogram hist, double seconds)
{
	const HistogramDef *def = &histogram_defs[hist];
	SharedHistogram *sh;
	int			i;

	if (lf_metrics == NULL)
		return;
	if (isnan(seconds) || seconds < 0)
		seconds = 0;

	sh = &lf_metrics->histograms[hist];
	for (i = 0; i < def->nbounds; i++)
	{
		if (seconds <= def->bounds[i])
			break;
	}
	pg_atomic_fetch_add_u64(&sh->buckets[i], 1);
	/* more than 500 years in one observation is clamped */
	pg_atomic_fetch_add_u64(&sh->sum_ns,
							seconds < 1.6e10 ? (uint64) (seconds * 1e9) :
							UINT64CONST(16000000000000000000));
}

/*
 * Would a rejection logged now reach the server log or the client?
 */
static bool
lockfence_log_wanted(void)
{
	return lockfence_log_rejections != LF_LOG_OFF &&
		message_level_is_interesting(lockfence_log_rejections);
}

/*
 * Append key=value to buf, after a space unless buf is empty, logfmt
 * style: a log processor gets back exactly the value that was logged, and
 * no caller can forge a field with a name holding quotes, spaces or
 * newlines.  The value is quoted when always_quote is set (the documented
 * form of the name fields) or when it is empty or holds a space, '=',
 * '"', '\' or a control character.  Inside quotes '"' and '\' are
 * escaped with a backslash; newline, carriage return and tab become \n,
 * \r and \t, and any other control character becomes \u00XX.  Bytes of
 * multibyte characters pass through.
 */
static void
append_logfmt_field(StringInfo buf, const char *key, const char *value,
					bool always_quote)
{
	const unsigned char *p;
	bool		quote = always_quote || value[0] == '\0';

	for (p = (const unsigned char *) value; !quote && *p; p++)
	{
		if (*p <= ' ' || *p == '=' || *p == '"' || *p == '\\' || *p == 0x7f)
			quote = true;
	}

	if (buf->len > 0)
		appendStringInfoChar(buf, ' ');
	appendStringInfo(buf, "%s=", key);
	if (!quote)
	{
		appendStringInfoString(buf, value);
		return;
	}

	appendStringInfoChar(buf, '"');
	for (p = (const unsigned char *) value; *p; p++)
	{
		switch (*p)
		{
			case '"':
			case '\\':
				appendStringInfoChar(buf, '\\');
				appendStringInfoChar(buf, (char) *p);
				break;
			case '\n':
				appendStringInfoString(buf, "\\n");
				break;
			case '\r':
				appendStringInfoString(buf, "\\r");
				break;
			case '\t':
				appendStringInfoString(buf, "\\t");
				break;
			default:
				if (*p < ' ' || *p == 0x7f)
					appendStringInfo(buf, "\\u%04x", (unsigned int) *p);
				else
					appendStringInfoChar(buf, (char) *p);
				break;
		}
	}
	appendStringInfoChar(buf, '"');
}

/*
 * Emit the log line of one rejection at lockfence.log_rejections.  One
 * line in logfmt, so that a log processor needs no DETAIL line:
 *
 *	lockfence rejected a write: reason=... resource="..." token=... highest=...
 *	  [holder="..."] [highest_holder="..."] [table="..."]
 *	  application_name="..." pid=...
 *
 * token and highest are "none" when there is no such token.  The name
 * fields are always quoted and escaped (append_logfmt_field), so the line
 * stays one line whatever the names hold.
 */
static void
lockfence_log_rejection(int sqlstate, const char *reason,
						const char *resource, const char *relname,
						bool has_token, int64 token,
						bool has_highest, int64 highest,
						const char *holder, const char *highest_holder)
{
	char		numbuf[32];
	StringInfoData fields;

	if (!lockfence_log_wanted())
		return;

	initStringInfo(&fields);
	append_logfmt_field(&fields, "reason", reason, false);
	append_logfmt_field(&fields, "resource", resource, true);
	if (has_token)
		snprintf(numbuf, sizeof(numbuf), INT64_FORMAT, token);
	else
		strlcpy(numbuf, "none", sizeof(numbuf));
	append_logfmt_field(&fields, "token", numbuf, false);
	if (has_highest)
		snprintf(numbuf, sizeof(numbuf), INT64_FORMAT, highest);
	else
		strlcpy(numbuf, "none", sizeof(numbuf));
	append_logfmt_field(&fields, "highest", numbuf, false);
	if (holder != NULL)
		append_logfmt_field(&fields, "holder", holder, true);
	if (highest_holder != NULL)
		append_logfmt_field(&fields, "highest_holder", highest_holder, true);
	if (relname != NULL)
		append_logfmt_field(&fields, "table", relname, true);
	append_logfmt_field(&fields, "application_name",
						application_name ? application_name : "", true);
	snprintf(numbuf, sizeof(numbuf), "%d", MyProcPid);
	append_logfmt_field(&fields, "pid", numbuf, false);

	ereport(lockfence_log_rejections,
			(errcode(sqlstate),
			 errmsg("lockfence rejected a write: %s", fields.data),
			 errhidestmt(true)));
	pfree(fields.data);
}

/*
 * Count one check that lockfence_check() accepted.
 */
void
lockfence_metrics_fence_accepted(void)
{
	lockfence_count(LFC_FENCE_ACCEPTED);
}

/*
 * Put a rejection of resource into the top list: bump its entry, or make
 * one, evicting the entry with the fewest rejections (the least recent
 * among equals) when the list is full.
 */
static void
lockfence_remember_rejection(const char *resource, int64 token, int64 highest)
{
	TimestampTz now = GetCurrentTimestamp();
	RejectedResource *entry = NULL;
	int			i;

	LWLockAcquire(lf_metrics->lock, LW_EXCLUSIVE);
	for (i = 0; i < lf_metrics->nresources; i++)
	{
		if (strcmp(lf_metrics->resources[i].resource, resource) == 0)
		{
			entry = &lf_metrics->resources[i];
			break;
		}
	}
	if (entry == NULL)
	{
		if (lf_metrics->nresources < LOCKFENCE_METRICS_TOP_RESOURCES)
			entry = &lf_metrics->resources[lf_metrics->nresources++];
		else
		{
			entry = &lf_metrics->resources[0];
			for (i = 1; i < LOCKFENCE_METRICS_TOP_RESOURCES; i++)
			{
				RejectedResource *r = &lf_metrics->resources[i];

				if (r->rejections < entry->rejections ||
					(r->rejections == entry->rejections &&
					 r->last_at < entry->last_at))
					entry = r;
			}
			pg_atomic_fetch_add_u64(&lf_metrics->counters[LFC_RESOURCES_EVICTED],
									1);
		}
		strlcpy(entry->resource, resource, sizeof(entry->resource));
		entry->rejections = 0;
	}
	entry->rejections++;
	entry->last_token = token;
	entry->highest = highest;
	entry->last_at = now;
	LWLockRelease(lf_metrics->lock);
}

/*
 * Count and log a token that lockfence_check() rejected: stale, or equal
 * to the highest but from another holder.  Called once per rejection,
 * whether or not the caller then raises.
 */
void
lockfence_metrics_fence_rejected(const char *resource, int64 token,
								 const char *holder,
								 const FenceOutcome *outcome)
{
	bool		conflict = (outcome->verdict == FENCE_HOLDER_CONFLICT);
	bool		lease_lost = (outcome->verdict == FENCE_LEASE_LOST);

	lockfence_count(conflict ? LFC_REJECTED_HOLDER_CONFLICT :
					lease_lost ? LFC_REJECTED_LEASE_LOST :
					LFC_REJECTED_STALE);
	if (lf_metrics != NULL)
		lockfence_remember_rejection(resource, token, outcome->highest);

	lockfence_log_rejection(lease_lost ? ERRCODE_LOCKFENCE_LOCK_LOST :
							ERRCODE_LOCKFENCE_STALE_TOKEN,
							conflict ? "holder_conflict" :
							lease_lost ? "lease_lost" : "stale_token",
							resource, NULL, true, token,
							true, outcome->highest,
							holder, conflict ? outcome->highest_holder : NULL);
}

/*
 * Count and log a write to a protected table that the trigger rejects for
 * carrying no token.  The highest token is looked up only for the log.
 */
void
lockfence_metrics_missing_token(const char *relname, const char *resource)
{
	int64		highest = 0;
	bool		has_highest = false;

	lockfence_count(LFC_REJECTED_MISSING_TOKEN);

	if (lockfence_log_wanted())
	{
		has_highest = fence_store_current(resource, &highest);
		lockfence_log_rejection(ERRCODE_LOCKFENCE_MISSING_TOKEN,
								"missing_token", resource, relname,
								false, 0, has_highest, highest, NULL, NULL);
	}
}

/*
 * Count a write the trigger was about to let through without an accepted
 * token.  Only a bug in the trigger can get here; the caller refuses the
 * write after this returns.
 */
void
lockfence_metrics_proceeded_without_lock(const char *relname)
{
	lockfence_count(LFC_PROCEEDED_WITHOUT_LOCK);
	ereport(WARNING,
			(errcode(ERRCODE_INTERNAL_ERROR),
			 errmsg_internal("lockfence trigger reached the end of a write to table \"%s\" without an accepted fencing token",
							 relname)));
}

/*
 * etcd: a lock was granted after seconds.
 */
void
lockfence_metrics_etcd_acquired(double seconds)
{
	lockfence_count(LFC_ACQUIRED);
	lockfence_observe(LFH_ACQUIRE_DURATION, seconds);
}

/*
 * etcd: an acquisition ended without the lock.
 */
void
lockfence_metrics_etcd_acquire_failed(void)
{
	lockfence_count(LFC_ACQUIRE_ERRORS);
}

/*
 * etcd: a lock ended after being held for held_seconds.
 */
void
lockfence_metrics_etcd_released(double held_seconds)
{
	lockfence_observe(LFH_HOLD_DURATION, held_seconds);
}

/*
 * Leases (lease.c): a grant after seconds (waiting included).
 */
void
lockfence_metrics_lease_acquired(double seconds)
{
	lockfence_count(LFC_LEASE_ACQUIRED);
	lockfence_observe(LFH_LEASE_ACQUIRE_DURATION, seconds);
}

/*
 * Leases: lease_acquire's wait_timeout ran out.
 */
void
lockfence_metrics_lease_acquire_failed(void)
{
	lockfence_count(LFC_LEASE_ACQUIRE_ERRORS);
}

/*
 * Leases: a lease ended after held_seconds: released, or expired and taken
 * over by the next grant (counted in lease_expired_taken_over_total).
 */
void
lockfence_metrics_lease_ended(double held_seconds, bool expired)
{
	if (expired)
		lockfence_count(LFC_LEASE_EXPIRED_TAKEN_OVER);
	lockfence_observe(LFH_LEASE_HOLD_DURATION, held_seconds);
}

/*
 * Raise the error for reading metrics that do not exist.
 */
static void
lockfence_metrics_require(void)
{
	if (lf_metrics == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("lockfence metrics are not available"),
				 errdetail("The lockfence library was not loaded through shared_preload_libraries, so no shared memory was set aside for its metrics."),
				 errhint("Add lockfence to shared_preload_libraries and restart the server.")));
}

/*
 * lockfence.read_metrics() returns (name text, value bigint): the plain
 * counters, the total of fence rejections, and the size of the top list.
 */
Datum
lockfence_read_metrics(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	uint64		values[LFC_NUM_COUNTERS];
	Datum		row[2];
	bool		nulls[2] = {false, false};
	int			ntracked;
	int			i;

	lockfence_metrics_require();
	/*
	 * floor_required reads lockfence.floor_state, which a parallel worker
	 * cannot: say so in the name of what was called.
	 */
	lockfence_refuse_parallel_mode("lockfence.read_metrics()");
	InitMaterializedSRF(fcinfo, 0);

	for (i = 0; i < LFC_NUM_COUNTERS; i++)
		values[i] = pg_atomic_read_u64(&lf_metrics->counters[i]);
	LWLockAcquire(lf_metrics->lock, LW_SHARED);
	ntracked = lf_metrics->nresources;
	LWLockRelease(lf_metrics->lock);

	for (i = 0; i < LFC_NUM_COUNTERS; i++)
	{
		row[0] = CStringGetTextDatum(counter_names[i]);
		row[1] = Int64GetDatum((int64) values[i]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, row, nulls);
	}
	row[0] = CStringGetTextDatum("fence_rejected_total");
	row[1] = Int64GetDatum((int64) (values[LFC_REJECTED_STALE] +
									values[LFC_REJECTED_HOLDER_CONFLICT] +
									values[LFC_REJECTED_LEASE_LOST]));
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, row, nulls);
	row[0] = CStringGetTextDatum("rejection_resources_tracked");
	row[1] = Int64GetDatum(ntracked);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, row, nulls);

	/*
	 * A gauge of this database, not of the cluster: 1 while fenced writes
	 * and lease operations are refused because the server was promoted (or
	 * the database restored) and the floor was not raised (LF004).
	 */
	row[0] = CStringGetTextDatum("floor_required");
	row[1] = Int64GetDatum(lockfence_failover_floor_required() ? 1 : 0);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, row, nulls);

	return (Datum) 0;
}

/*
 * lockfence.read_rejections() returns the top list: (resource text,
 * rejections bigint, last_rejected_token bigint, highest_token bigint,
 * last_rejected_at timestamptz).
 */
Datum
lockfence_read_rejections(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	RejectedResource *copy;
	int			n;
	int			i;

	lockfence_metrics_require();
	InitMaterializedSRF(fcinfo, 0);

	/* Copy under the lock, build tuples (which may raise) after it. */
	copy = palloc(sizeof(RejectedResource) * LOCKFENCE_METRICS_TOP_RESOURCES);
	LWLockAcquire(lf_metrics->lock, LW_SHARED);
	n = lf_metrics->nresources;
	memcpy(copy, lf_metrics->resources, sizeof(RejectedResource) * n);
	LWLockRelease(lf_metrics->lock);

	for (i = 0; i < n; i++)
	{
		Datum		row[5];
		bool		nulls[5] = {false, false, false, false, false};

		row[0] = CStringGetTextDatum(copy[i].resource);
		row[1] = Int64GetDatum((int64) copy[i].rejections);
		row[2] = Int64GetDatum(copy[i].last_token);
		row[3] = Int64GetDatum(copy[i].highest);
		row[4] = TimestampTzGetDatum(copy[i].last_at);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, row, nulls);
	}
	pfree(copy);

	return (Datum) 0;
}

/*
 * lockfence.read_histograms() returns one row per histogram: (name text,
 * le float8[], buckets bigint[], sum float8, count bigint), with le the
 * finite upper bounds, buckets the cumulative counts for them, and count
 * the +Inf bucket, as Prometheus and postgres_exporter's HISTOGRAM want.
 */
Datum
lockfence_read_histograms(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int			h;

	lockfence_metrics_require();
	InitMaterializedSRF(fcinfo, 0);

	for (h = 0; h < LFH_NUM_HISTOGRAMS; h++)
	{
		const HistogramDef *def = &histogram_defs[h];
		SharedHistogram *sh = &lf_metrics->histograms[h];
		Datum		bounds[LF_MAX_BOUNDS];
		Datum		counts[LF_MAX_BOUNDS];
		uint64		cumulative = 0;
		Datum		row[5];
		bool		nulls[5] = {false, false, false, false, false};
		int			i;

		for (i = 0; i <= def->nbounds; i++)
		{
			cumulative += pg_atomic_read_u64(&sh->buckets[i]);
			if (i < def->nbounds)
			{
				bounds[i] = Float8GetDatum(def->bounds[i]);
				counts[i] = Int64GetDatum((int64) cumulative);
			}
		}

		row[0] = CStringGetTextDatum(def->name);
		row[1] = PointerGetDatum(construct_array(bounds, def->nbounds,
												 FLOAT8OID, sizeof(float8),
												 FLOAT8PASSBYVAL,
												 TYPALIGN_DOUBLE));
		row[2] = PointerGetDatum(construct_array(counts, def->nbounds,
												 INT8OID, sizeof(int64),
												 FLOAT8PASSBYVAL,
												 TYPALIGN_DOUBLE));
		row[3] = Float8GetDatum((double) pg_atomic_read_u64(&sh->sum_ns) / 1e9);
		row[4] = Int64GetDatum((int64) cumulative);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, row, nulls);
	}

	return (Datum) 0;
}

/*
 * lockfence.reset_metrics() sets every metric back to zero and empties the
 * top list.  Not executable by PUBLIC.
 */
Datum
lockfence_reset_metrics(PG_FUNCTION_ARGS)
{
	lockfence_metrics_require();

	LWLockAcquire(lf_metrics->lock, LW_EXCLUSIVE);
	lockfence_metrics_zero(lf_metrics);
	LWLockRelease(lf_metrics->lock);

	PG_RETURN_VOID();
}

#ifdef LOCKFENCE_TEST_HOOKS
/*
 * lockfence_metrics_test_event(event text, seconds float8): TEST HOOK.
 *
 * Feeds one etcd event ('acquired', 'acquire_failed' or 'released') to the
 * functions the etcd client calls, so that the etcd metrics and their
 * exporter queries can be tested before that client exists.  The extension
 * script does not create a SQL function for it; a test creates one as
 * superuser with AS 'MODULE_PATHNAME', 'lockfence_metrics_test_event'.
 * Compiled only with LOCKFENCE_TEST_HOOKS (make LOCKFENCE_TEST_HOOKS=1,
 * as test/run-all.sh builds): the shipped library has no test hook.
 */
Datum
lockfence_metrics_test_event(PG_FUNCTION_ARGS)
{
	char	   *event = text_to_cstring(PG_GETARG_TEXT_PP(0));
	double		seconds = PG_GETARG_FLOAT8(1);

	if (strcmp(event, "acquired") == 0)
		lockfence_metrics_etcd_acquired(seconds);
	else if (strcmp(event, "acquire_failed") == 0)
		lockfence_metrics_etcd_acquire_failed();
	else if (strcmp(event, "released") == 0)
		lockfence_metrics_etcd_released(seconds);
	else
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("unknown lockfence metrics event \"%s\"", event)));

	PG_RETURN_VOID();
}
#endif							/* LOCKFENCE_TEST_HOOKS */
