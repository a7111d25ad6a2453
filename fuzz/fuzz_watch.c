/*-------------------------------------------------------------------------
 *
 * fuzz_watch.c
 *	  Fuzz harness: the byte stream of an etcd watch, as a lock waiter
 *	  reads it.
 *
 * The input is the body of a /v3/watch stream (newline-separated JSON
 * messages; the corpus is a real etcd's: "created", then events with the
 * DELETE of the watched key).  It is handed to watch_poll()
 * (etcd_lock_wait.c, included for its static functions) in three growing
 * pieces while the request runs, then once more after it ended, the way
 * the waiter's loop sees it arrive: message splitting at newlines across
 * pieces, watch_message()'s decoding, the DELETE match on the predecessor
 * key.  Only "malformed reply" (08P01) may be raised.
 *
 * IDENTIFICATION
 *	  fuzz/fuzz_watch.c
 *
 *-------------------------------------------------------------------------
 */
#include "fuzz_common.h"

#include "utils/timestamp.h"

#include "../src/etcd_http.c"
#include "../src/etcd_lock_wait.c"

/* watch_poll() until it has nothing new; false once the wait would stop */
static bool
poll_stage(LockWait *w, EtcdHttpReq *req)
{
	for (;;)
	{
		WatchNews	news = watch_poll(w);

		FUZZ_CHECK(w->consumed <= req->resp_len);
		FUZZ_CHECK(w->consumed == 0 || req->resp[w->consumed - 1] == '\n');
		switch (news)
		{
			case WATCH_NOTHING:
				return true;
			case WATCH_CREATED:
				FUZZ_CHECK(w->created);
				continue;
			case WATCH_RECHECK:
				continue;
			case WATCH_DELETED:
				return false;
			case WATCH_FAILED:
				FUZZ_CHECK(w->watch_error != NULL);
				return false;
		}
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	EtcdHttpReq *req;
	LockWait	w;
	size_t		stages[3];
	int			i;

	if (size > ETCD_MAX_REPLY_BYTES)
		return 0;
	fuzz_begin();

	/* the stream as the write callback leaves it: malloc'd, NUL after */
	req = calloc(1, sizeof(EtcdHttpReq));
	req->resp = malloc(size + 1);
	memcpy(req->resp, data, size);
	req->resp[size] = '\0';
	req->resp_cap = size + 1;

	memset(&w, 0, sizeof(w));
	w.name = "lf/fuzz";
	w.key = "lf/fuzz/694d8720bc104581";
	w.lease = FUZZ_LEASE;
	w.my_rev = 3;
	w.cxt = CurrentMemoryContext;
	w.pred = pstrdup(FUZZ_KEY);
	w.watch_req = req;
	w.watch_ep = FUZZ_ENDPOINT;
	w.watch_started = GetCurrentTimestamp();

	/* pieces cut where the input says (its first bytes), then the rest */
	stages[0] = size ? data[0] % (size + 1) : 0;
	stages[1] = size > 1 ? Max(stages[0], (size_t) data[1] * size / 255) : size;
	stages[2] = size;

	PG_TRY();
	{
		bool		go_on = true;

		for (i = 0; i < 3 && go_on; i++)
		{
			req->resp_len = Min(stages[i], size);
			go_on = poll_stage(&w, req);
		}
		if (go_on)
		{
			/* the stream ended */
			req->done = true;
			req->result = CURLE_OK;
			req->http_code = 200;
			FUZZ_CHECK(!poll_stage(&w, req));
		}
	}
	PG_CATCH();
	{
		fuzz_expect_error(ERRCODE_PROTOCOL_VIOLATION);
	}
	PG_END_TRY();

	free(req->resp);
	free(req);
	fuzz_end();
	return 0;
}
