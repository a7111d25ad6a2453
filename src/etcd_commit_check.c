/*-------------------------------------------------------------------------
 *
 * etcd_commit_check.c
 *	  Before a transaction commits, confirm with etcd that every etcd lock
 *	  it fenced with is still held (lockfence.etcd_check_at_commit).
 *
 * A holder whose lease expired can still write until its successor
 * fences: the fence only knows tokens it has seen.  The commit check closes
 * most of that window, the way Chubby checks a sequencer with the lock
 * service: at XACT_EVENT_PRE_COMMIT, one linearizable etcd transaction per
 * lock compares the lock key's create_revision (the token) and lease; if
 * any lock is gone, the commit fails with LF003 naming it, and nothing of
 * the transaction is written.  The request is retried on other endpoints
 * within lockfence.etcd_request_timeout (a leader election), and a cancel
 * while it waits aborts the transaction.
 *
 * What is checked: lock_and_fence (the default) checks the locks the
 * transaction fenced with through etcd_lock_and_fence; all_fenced also
 * the locks of this backend that a fence check accepted in the
 * transaction named (lockfence.fence(resource, token, holder => key),
 * try_fence, the array forms and the trigger), whether the check wrote the fence row or
 * only share-locked a row that already recorded the token: the normal
 * "fence at the start of each transaction" under one lock.  The fence
 * checks record them as they accept (etcd_session_fence_accepted), so
 * nothing is read at commit.  A fence undone by a rollback to a savepoint
 * is not checked.  Transactions that fenced with no etcd lock of this
 * backend send nothing.
 *
 * The window left: between the check's answer and the commit record, a
 * lease may still expire; but then the successor's token is higher, and
 * as soon as it fences, the fence refuses the old holder's next write.
 *
 * IDENTIFICATION
 *	  src/etcd_commit_check.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "lib/stringinfo.h"
#include "utils/jsonb.h"

#include "etcd.h"
#include "lockfence.h"

/*
 * Is the lock still held: its key exists with create_revision = token on
 * its lease?  One etcd transaction, linearizable like every txn.
 *
 * Both branches read the key back, so that the reply names it: a reply
 * whose branches ran no operation carries only "succeeded", and on a
 * connection out of step with its server another lock's "still held"
 * would pass for this one's (etcd_reply_matches can only compare what a
 * reply names).  A passing reply must show the key with the token and the
 * lease compared; anything else is malformed, and the commit fails.
 */
static bool
lock_still_held(const EtcdCheckedLock *l)
{
	static const char what[] = "the commit-time lock check";
	char	   *key64 = etcd_b64_encode(l->key, strlen(l->key));
	char	   *body;
	EtcdReply	reply;
	JsonbContainer *root;
	JsonbContainer *range;
	JsonbContainer *kv;
	char	   *kv_key;
	int			kv_key_len;
	int64		create_rev = 0;
	int64		kv_lease = 0;

	body = psprintf("{\"compare\":["
					"{\"target\":\"CREATE\",\"key\":\"%s\",\"create_revision\":\"" INT64_FORMAT "\"},"
					"{\"target\":\"LEASE\",\"key\":\"%s\",\"lease\":\"" INT64_FORMAT "\"}],"
					"\"success\":[{\"request_range\":{\"key\":\"%s\"}}],"
					"\"failure\":[{\"request_range\":{\"key\":\"%s\"}}]}",
					key64, l->token, key64, l->lease, key64, key64);
	if (!etcd_call("/v3/kv/txn", body, etcd_request_timeout_ms, false,
				   &reply))
		etcd_report_reply_error(what, &reply);
	root = &reply.json->root;
	/* etcd omits false: no "succeeded" means a comparison failed */
	if (!etcd_json_bool(root, "succeeded"))
		return false;

	if (etcd_json_array_length(root, "responses") != 1 ||
		(range = etcd_json_object(etcd_json_array_object(root, "responses", 0),
								  "response_range")) == NULL ||
		etcd_json_array_length(range, "kvs") != 1)
		etcd_malformed_reply(what,
							 "The reply that the comparisons passed does not carry the lock key read back.");
	kv = etcd_json_array_object(range, "kvs", 0);
	kv_key = etcd_json_bytes(kv, "key", &kv_key_len);
	(void) etcd_json_int64(kv, "create_revision", &create_rev);
	(void) etcd_json_int64(kv, "lease", &kv_lease);
	if (kv_key == NULL || kv_key_len != (int) strlen(l->key) ||
		memcmp(kv_key, l->key, kv_key_len) != 0 ||
		create_rev != l->token || kv_lease != l->lease)
		etcd_malformed_reply(what,
							 psprintf("The reply that the comparisons passed shows another key, or the key at another create_revision or on another lease than lock \"%s\" (token " INT64_FORMAT ", lease " INT64_FORMAT ").",
									  l->key, l->token, l->lease));
	return true;
}

/*
 * The check itself, called from the transaction callback at
 * XACT_EVENT_PRE_COMMIT.  Raises LF003 naming every lock found lost.
 */
static void
etcd_commit_check(void)
{
	EtcdCheckedLock *locks;
	int			n;
	int			i;
	int			n_lost = 0;
	StringInfoData lost;
	const char *lost_key;

	if (etcd_check_at_commit == ETCD_CHECK_OFF)
		return;
	/* a lock found lost during the transaction is no longer listed */
	if (etcd_session_lost_in_xact(etcd_check_at_commit == ETCD_CHECK_ALL_FENCED,
								  &lost_key))
		ereport(ERROR,
				(errcode(ERRCODE_LOCKFENCE_LOCK_LOST),
				 errmsg("etcd lock \"%s\" was lost before commit", lost_key),
				 errdetail("The transaction fenced with its token, and the lock was found lost during the transaction."),
				 errhint("The transaction was rolled back; acquire the lock again and retry.")));
	n = etcd_session_locks_to_check(etcd_check_at_commit == ETCD_CHECK_ALL_FENCED,
									&locks);
	if (n == 0)
		return;
	initStringInfo(&lost);

	for (i = 0; i < n; i++)
	{
		elog(DEBUG1, "etcd commit check of lock \"%s\" (token " INT64_FORMAT ")",
			 locks[i].key, locks[i].token);
		if (!lock_still_held(&locks[i]))
		{
			appendStringInfo(&lost, "%s\"%s\"", lost.len ? ", " : "",
							 locks[i].key);
			n_lost++;
		}
	}
	if (n_lost > 0)
		ereport(ERROR,
				(errcode(ERRCODE_LOCKFENCE_LOCK_LOST),
				 errmsg_plural("etcd lock %s was lost before commit",
							   "etcd locks %s were lost before commit",
							   n_lost, lost.data),
				 errdetail("The transaction fenced with their tokens, but etcd no longer holds each key with that create_revision on its lease: the lease expired or the lock was released."),
				 errhint("The transaction was rolled back; acquire the lock again and retry.")));
}

/*
 * Transaction callback: the check runs at PRE_COMMIT, where an error still
 * aborts the transaction cleanly (LF003: nothing of it is written).
 * etcd_session.c's own callback does nothing at PRE_COMMIT, so the order
 * of the two does not matter.
 */
static void
etcd_commit_check_xact(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_PRE_COMMIT)
		etcd_commit_check();
}

/*
 * Install the commit check: called once from _PG_init.  A backend that
 * holds no etcd lock pays two tests per commit.
 */
void
etcd_commit_check_init(void)
{
	RegisterXactCallback(etcd_commit_check_xact, NULL);
}
