/*-------------------------------------------------------------------------
 *
 * etcd_cluster.c
 *	  What lockfence reads about the etcd cluster itself, not about a
 *	  lock: its current revision (the floor for fences after a lossy
 *	  failover, lockfence.etcd_raise_floor) and its status (the etcd probe
 *	  of lockfence.check()).
 *
 * An asynchronous standby that is promoted may have lost fence advances
 * the old primary acknowledged; tokens the old primary rejected would then
 * be accepted again.  Every fencing token an etcd lock has issued is the
 * create_revision of a lock key, so it is at most the revision of the
 * cluster's store at the time it was issued.  A linearizable read returns,
 * in its header, a revision that includes every write committed before the
 * read began: raising every fence above it (lockfence.etcd_raise_floor)
 * rejects every token issued before, and accepts the tokens of locks
 * acquired afterwards.
 *
 * IDENTIFICATION
 *	  src/etcd_cluster.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/builtins.h"

#include "etcd.h"

PG_FUNCTION_INFO_V1(lockfence_etcd_revision);
PG_FUNCTION_INFO_V1(lockfence_etcd_status);

/*
 * The key the revision read ranges over.  It need not exist: only the
 * reply's header matters.  With etcd authentication, the etcd user needs
 * read permission on it.
 */
#define ETCD_FLOOR_PROBE_KEY	"lockfence/floor"

/*
 * lockfence.etcd_revision() returns the etcd cluster's current revision,
 * read with a linearizable (the default, not serializable) range request
 * through lockfence.etcd_endpoints.
 */
Datum
lockfence_etcd_revision(PG_FUNCTION_ARGS)
{
	EtcdReply	reply;
	JsonbContainer *header;
	int64		revision;
	char	   *key64 = etcd_b64_encode(ETCD_FLOOR_PROBE_KEY,
										strlen(ETCD_FLOOR_PROBE_KEY));
	char	   *body = psprintf("{\"key\":\"%s\",\"count_only\":true}", key64);

	if (!etcd_call("/v3/kv/range", body, etcd_request_timeout_ms, false,
				   &reply))
		etcd_report_reply_error("reading the etcd revision", &reply);

	header = etcd_json_object(&reply.json->root, "header");
	if (header == NULL)
		etcd_malformed_reply("reading the etcd revision",
							 "The reply carries no header.");
	if (!etcd_json_int64(header, "revision", &revision) || revision <= 0)
		etcd_malformed_reply("reading the etcd revision",
							 "The reply header carries no positive revision.");
	PG_RETURN_INT64(revision);
}

/*
 * lockfence.etcd_status(timeout_ms): ask the configured etcd endpoints for
 * their status, failing over between them within timeout_ms.  Returns the
 * endpoint that answered, the leader's member ID (NULL: no leader) and the
 * cluster's revision.  Raises the usual connection errors; check() catches
 * them.
 */
Datum
lockfence_etcd_status(PG_FUNCTION_ARGS)
{
	int32		timeout_ms = PG_GETARG_INT32(0);
	EtcdReply	reply;
	char	   *leader;
	int64		revision = 0;
	JsonbContainer *header;
	TupleDesc	tupdesc;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	if (timeout_ms <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("timeout_ms must be positive")));
	if (etcd_endpoint_count() == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("lockfence.etcd_endpoints is not set")));
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	if (!etcd_call("/v3/maintenance/status", "{}", timeout_ms, false, &reply))
		etcd_report_reply_error("a status request", &reply);
	/* Member IDs are unsigned 64-bit: kept as text.  Absent or 0: none. */
	leader = etcd_json_string(&reply.json->root, "leader");
	header = etcd_json_object(&reply.json->root, "header");
	if (header)
		(void) etcd_json_int64(header, "revision", &revision);

	values[0] = CStringGetTextDatum(reply.endpoint ? reply.endpoint : "");
	if (leader == NULL || strcmp(leader, "0") == 0)
		nulls[1] = true;
	else
		values[1] = CStringGetTextDatum(leader);
	values[2] = Int64GetDatum(revision);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc),
													  values, nulls)));
}
