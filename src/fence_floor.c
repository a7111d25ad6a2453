/*-------------------------------------------------------------------------
 *
 * fence_floor.c
 *	  The etcd cluster's current revision, a floor for fences after a
 *	  lossy failover.
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
 *	  src/fence_floor.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"

#include "etcd.h"

/*
 * The key the revision read ranges over.  It need not exist: only the
 * reply's header matters.  With etcd authentication, the etcd user needs
 * read permission on it.
 */
#define ETCD_FLOOR_PROBE_KEY	"lockfence/floor"

PG_FUNCTION_INFO_V1(lockfence_etcd_revision);

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
