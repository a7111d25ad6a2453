/*-------------------------------------------------------------------------
 *
 * etcd_http.c
 *	  libcurl transport for the etcd lock functions.
 *
 * All requests of a backend run on one curl multi handle, which keeps the
 * connections to etcd alive between calls.  The multi handle reports the
 * sockets it needs through CURLMOPT_SOCKETFUNCTION and its next timeout
 * through CURLMOPT_TIMERFUNCTION; etcd_http_wait() turns these into a
 * WaitEventSet together with the process latch, so a query cancel, a
 * statement timeout or a termination request wakes the wait at once.
 *
 * libcurl callbacks only record state in malloc'd memory: they never
 * palloc, ereport or look at anything but plain flags.  Every live easy
 * handle is on a list, so etcd_http_abort_all() can release all of them
 * after an error.
 *
 * IDENTIFICATION
 *	  src/etcd_http.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <poll.h>
#include <unistd.h>

#include <curl/curl.h>

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "etcd.h"

/* One HTTP exchange, allocated with malloc. */
struct EtcdHttpReq
{
	CURL	   *easy;
	struct curl_slist *headers;
	char	   *body;			/* request body (curl does not copy it) */
	char	   *resp;			/* reply body received so far */
	size_t		resp_len;
	size_t		resp_cap;
	bool		too_large;		/* reply exceeded the cap */
	bool		done;
	CURLcode	result;
	long		http_code;
	char		errbuf[CURL_ERROR_SIZE];
	struct EtcdHttpReq *prev;
	struct EtcdHttpReq *next;
};

/* A socket libcurl asked us to watch. */
typedef struct EtcdSock
{
	curl_socket_t fd;
	int			what;			/* CURL_POLL_IN/OUT/INOUT */
} EtcdSock;

#define ETCD_MAX_SOCKS 16

static CURLM *multi = NULL;
static EtcdHttpReq *live_reqs = NULL;
static EtcdSock socks[ETCD_MAX_SOCKS];
static int	nsocks = 0;
static bool socks_overflow = false;
static long curl_timer_ms = -1;	/* -1: no timer */
static TimestampTz curl_timer_set_at = 0;

/*
 * Set after a reply anomaly: the kept-alive connections are closed as soon
 * as no request is live (see etcd_http_forget_connections).
 */
static bool forget_pending = false;

/*
 * Every socket libcurl opened and has not closed yet, through our
 * open/close socket callbacks: those not in socks[] (which a running
 * transfer uses) belong to kept-alive connections waiting in the pool.
 * multiplexed: the connection carries HTTP/2, whose frames name their
 * stream, and on which the server may send frames of its own at any time.
 * untracked: more sockets were opened than fit here.
 */
#define ETCD_MAX_OPEN_SOCKS 64
typedef struct EtcdOpenSock
{
	curl_socket_t fd;
	bool		multiplexed;
} EtcdOpenSock;
static EtcdOpenSock open_socks[ETCD_MAX_OPEN_SOCKS];
static int	n_open_socks = 0;
static bool untracked_socks = false;

static size_t write_cb(char *ptr, size_t size, size_t nmemb, void *userdata);
static int	socket_cb(CURL *easy, curl_socket_t s, int what, void *userp,
					  void *socketp);
static int	timer_cb(CURLM *m, long timeout_ms, void *userp);
static int	collect_done(void);
static void ensure_multi(void);
static void free_req(EtcdHttpReq *req);
static void drop_pool_if_idle(void);
static curl_socket_t opensocket_cb(void *clientp, curlsocktype purpose,
								   struct curl_sockaddr *address);
static int	closesocket_cb(void *clientp, curl_socket_t item);
static bool idle_connection_has_input(void);
static void note_connection(CURL *easy);

/*
 * Write callback: append to the reply buffer, refusing more than
 * ETCD_MAX_REPLY_BYTES.  Returning less than asked makes libcurl fail the
 * transfer with CURLE_WRITE_ERROR.
 */
static size_t
write_cb(char *ptr, size_t size, size_t nmemb, void *userdata)
{
	EtcdHttpReq *req = (EtcdHttpReq *) userdata;
	size_t		n = size * nmemb;

	if (n > ETCD_MAX_REPLY_BYTES || req->resp_len + n > ETCD_MAX_REPLY_BYTES)
	{
		req->too_large = true;
		return 0;
	}
	if (req->resp_len + n + 1 > req->resp_cap)
	{
		size_t		newcap = Max(req->resp_cap * 2, req->resp_len + n + 1);
		char	   *p;

		newcap = Min(newcap, (size_t) ETCD_MAX_REPLY_BYTES + 1);
		p = realloc(req->resp, newcap);
		if (p == NULL)
			return 0;
		req->resp = p;
		req->resp_cap = newcap;
	}
	memcpy(req->resp + req->resp_len, ptr, n);
	req->resp_len += n;
	req->resp[req->resp_len] = '\0';
	return n;
}

/*
 * Socket callback: remember which sockets libcurl wants watched.
 */
static int
socket_cb(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
	int			i;

	for (i = 0; i < nsocks; i++)
		if (socks[i].fd == s)
			break;

	if (what == CURL_POLL_REMOVE)
	{
		if (i < nsocks)
			socks[i] = socks[--nsocks];
		return 0;
	}
	if (i == nsocks)
	{
		if (nsocks >= ETCD_MAX_SOCKS)
		{
			socks_overflow = true;
			return -1;
		}
		nsocks++;
	}
	socks[i].fd = s;
	socks[i].what = what;
	return 0;
}

/*
 * Timer callback: remember when libcurl wants to be called back.
 */
static int
timer_cb(CURLM *m, long timeout_ms, void *userp)
{
	curl_timer_ms = timeout_ms;
	curl_timer_set_at = GetCurrentTimestamp();
	return 0;
}

/*
 * Open-socket callback: open the socket as libcurl would, and remember it.
 */
static curl_socket_t
opensocket_cb(void *clientp, curlsocktype purpose,
			  struct curl_sockaddr *address)
{
	curl_socket_t s;

	s = socket(address->family, address->socktype, address->protocol);
	if (s == CURL_SOCKET_BAD)
		return s;
	if (n_open_socks < ETCD_MAX_OPEN_SOCKS)
	{
		open_socks[n_open_socks].fd = s;
		open_socks[n_open_socks].multiplexed = false;
		n_open_socks++;
	}
	else
		untracked_socks = true;
	return s;
}

/*
 * Close-socket callback: forget the socket and close it.
 */
static int
closesocket_cb(void *clientp, curl_socket_t item)
{
	int			i;

	for (i = 0; i < n_open_socks; i++)
	{
		if (open_socks[i].fd == item)
		{
			open_socks[i] = open_socks[--n_open_socks];
			break;
		}
	}
	return close(item);
}

/*
 * Note the protocol of a finished transfer's connection, if it stays in
 * the pool (libcurl then reports it as the handle's active socket).
 */
static void
note_connection(CURL *easy)
{
	long		version = 0;
	curl_socket_t s = CURL_SOCKET_BAD;
	int			i;

	if (curl_easy_getinfo(easy, CURLINFO_HTTP_VERSION, &version) != CURLE_OK ||
		curl_easy_getinfo(easy, CURLINFO_ACTIVESOCKET, &s) != CURLE_OK ||
		s == CURL_SOCKET_BAD)
		return;
	for (i = 0; i < n_open_socks; i++)
		if (open_socks[i].fd == s)
			open_socks[i].multiplexed = (version >= CURL_HTTP_VERSION_2_0);
}

/*
 * Has any HTTP/1.x kept-alive connection waiting in the pool (an open
 * socket that no running transfer uses) received bytes (or an end of file
 * or error)?  Between requests, an HTTP/1.1 server has nothing to say:
 * such bytes are an answer to nothing we sent, which would be read as the
 * answer to our next request on that connection.  libcurl 7.88 reuses such
 * a connection (it only peeks for an end of file), hence this check.
 * HTTP/2 connections are left out: their frames name the stream they
 * belong to, so they cannot get out of step, and servers send frames of
 * their own on them (window updates, pings).  Sockets we lost track of
 * count as having input, to fail safe.
 */
static bool
idle_connection_has_input(void)
{
	struct pollfd pfd[ETCD_MAX_OPEN_SOCKS];
	int			n = 0;
	int			i;
	int			j;

	if (untracked_socks)
		return true;
	for (i = 0; i < n_open_socks; i++)
	{
		bool		running = false;

		for (j = 0; j < nsocks; j++)
			if (socks[j].fd == open_socks[i].fd)
				running = true;
		if (running || open_socks[i].multiplexed)
			continue;
		pfd[n].fd = open_socks[i].fd;
		pfd[n].events = POLLIN;
		pfd[n].revents = 0;
		n++;
	}
	if (n == 0)
		return false;
	return poll(pfd, n, 0) != 0;	/* input, or poll failed: not clean */
}

/*
 * Create the backend's multi handle on first use.
 */
static void
ensure_multi(void)
{
	static bool global_done = false;

	if (!global_done)
	{
		if (!etcd_curl_global_init())
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("could not initialize libcurl")));
		global_done = true;
	}
	if (multi == NULL)
	{
		multi = curl_multi_init();
		if (multi == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("could not create a libcurl multi handle")));
		curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, socket_cb);
		curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION, timer_cb);
		curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, 8L);
	}
}

/*
 * Release one request: detach it from the multi handle and free it.
 */
static void
free_req(EtcdHttpReq *req)
{
	if (req->prev)
		req->prev->next = req->next;
	else
		live_reqs = req->next;
	if (req->next)
		req->next->prev = req->prev;

	if (req->easy)
	{
		if (multi)
			curl_multi_remove_handle(multi, req->easy);
		curl_easy_cleanup(req->easy);
	}
	if (req->headers)
		curl_slist_free_all(req->headers);
	/* an authenticate request's body carries the password */
	if (req->body)
		explicit_bzero(req->body, strlen(req->body));
	free(req->body);
	free(req->resp);
	free(req);
	drop_pool_if_idle();
}

/*
 * Close every kept-alive connection, if that was asked for and no request
 * is live: the multi handle holds the connection pool, so it is simply
 * destroyed, and made again by the next request.
 */
static void
drop_pool_if_idle(void)
{
	if (!forget_pending || live_reqs != NULL)
		return;
	forget_pending = false;
	if (multi == NULL)
		return;
	curl_multi_cleanup(multi);
	multi = NULL;
	nsocks = 0;
	socks_overflow = false;
	curl_timer_ms = -1;
	/* every connection is closed now, through closesocket_cb */
	n_open_socks = 0;
	untracked_socks = false;
}

/*
 * Never send another request on a connection that brought a reply we could
 * not match to its request (malformed, or answering another request): the
 * connection may be out of step, holding or about to receive a reply that
 * belongs to nothing we sent.  etcd_http_start() already refuses a
 * connection with unread bytes, but bytes that arrive after the next
 * request went out are read as its reply, and only the caller's check of
 * that reply against its request can tell.  So after any anomaly every
 * kept-alive connection is closed, at once when no request is live, else
 * when the last live one is released (the error that follows an anomaly
 * releases them all).  Never raises an error.
 */
void
etcd_http_forget_connections(void)
{
	forget_pending = true;
	drop_pool_if_idle();
}

/*
 * Build a request's header list (kept in req->headers, freed with it).
 * Returns false when out of memory.
 */
static bool
set_headers(EtcdHttpReq *req, const char *auth_token)
{
	struct curl_slist *h;

	h = curl_slist_append(NULL, "Content-Type: application/json");
	if (h == NULL)
	{
		return false;
	}
	req->headers = h;
	/* Disable "Expect: 100-continue", which costs a round trip. */
	h = curl_slist_append(req->headers, "Expect:");
	if (h == NULL)
	{
		return false;
	}
	req->headers = h;
	if (auth_token && auth_token[0])
	{
		char	   *line = malloc(strlen(auth_token) + 32);

		if (line == NULL)
		{
			return false;
		}
		sprintf(line, "Authorization: %s", auth_token);
		h = curl_slist_append(req->headers, line);
		free(line);
		if (h == NULL)
		{
			return false;
		}
		req->headers = h;
	}

	return true;
}

/*
 * Set a request's libcurl options: only http(s), no redirects, our
 * sockets, the timeouts, the reply size limit and the TLS files.
 */
static void
set_options(EtcdHttpReq *req, const char *url, long timeout_ms,
			long connect_timeout_ms, bool fresh)
{
	curl_easy_setopt(req->easy, CURLOPT_URL, url);
#if LIBCURL_VERSION_NUM >= 0x075500
	curl_easy_setopt(req->easy, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(req->easy, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
	curl_easy_setopt(req->easy, CURLOPT_PROTOCOLS,
					 (long) (CURLPROTO_HTTP | CURLPROTO_HTTPS));
	curl_easy_setopt(req->easy, CURLOPT_REDIR_PROTOCOLS,
					 (long) (CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
	curl_easy_setopt(req->easy, CURLOPT_FOLLOWLOCATION, 0L);

	/*
	 * Never a proxy: libcurl would take one from the server's environment
	 * (http_proxy, HTTPS_PROXY, ALL_PROXY), which would see every request,
	 * the credentials included, and could answer with any token; only
	 * superusers choose where lock calls go (lockfence.etcd_endpoints).
	 */
	curl_easy_setopt(req->easy, CURLOPT_PROXY, "");
	curl_easy_setopt(req->easy, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(req->easy, CURLOPT_HTTPHEADER, req->headers);
	curl_easy_setopt(req->easy, CURLOPT_POSTFIELDS, req->body);
	curl_easy_setopt(req->easy, CURLOPT_POSTFIELDSIZE, (long) strlen(req->body));
	curl_easy_setopt(req->easy, CURLOPT_WRITEFUNCTION, write_cb);
	curl_easy_setopt(req->easy, CURLOPT_WRITEDATA, req);
	curl_easy_setopt(req->easy, CURLOPT_ERRORBUFFER, req->errbuf);
	curl_easy_setopt(req->easy, CURLOPT_PRIVATE, req);
	curl_easy_setopt(req->easy, CURLOPT_OPENSOCKETFUNCTION, opensocket_cb);
	curl_easy_setopt(req->easy, CURLOPT_CLOSESOCKETFUNCTION, closesocket_cb);
	if (fresh)
	{
		curl_easy_setopt(req->easy, CURLOPT_FRESH_CONNECT, 1L);
		curl_easy_setopt(req->easy, CURLOPT_FORBID_REUSE, 1L);
	}
	curl_easy_setopt(req->easy, CURLOPT_CONNECTTIMEOUT_MS,
					 Max(connect_timeout_ms, 1L));
	if (timeout_ms > 0)
		curl_easy_setopt(req->easy, CURLOPT_TIMEOUT_MS, timeout_ms);
	curl_easy_setopt(req->easy, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(req->easy, CURLOPT_TCP_NODELAY, 1L);
	curl_easy_setopt(req->easy, CURLOPT_MAXFILESIZE, (long) ETCD_MAX_REPLY_BYTES);
	if (etcd_cafile && etcd_cafile[0])
		curl_easy_setopt(req->easy, CURLOPT_CAINFO, etcd_cafile);
	if (etcd_certfile && etcd_certfile[0])
		curl_easy_setopt(req->easy, CURLOPT_SSLCERT, etcd_certfile);
	if (etcd_keyfile && etcd_keyfile[0])
		curl_easy_setopt(req->easy, CURLOPT_SSLKEY, etcd_keyfile);

}

/*
 * Start a POST of a JSON body to url.  timeout_ms <= 0 means no total
 * timeout (the caller bounds the wait itself).  The request runs while the
 * caller calls etcd_http_wait(); release it with etcd_http_finish().
 *
 * Returns NULL, without raising an error, when libcurl refuses to set the
 * request up (out of memory); callers treat that as a transport failure.
 */
EtcdHttpReq *
etcd_http_start(const char *url, const char *body, const char *auth_token,
				long timeout_ms, long connect_timeout_ms)
{
	EtcdHttpReq *req;
	CURLMcode	mc;
	bool		fresh = false;

	/*
	 * Never send a request on a connection with unread bytes: drop the
	 * pool, or while other requests run (and hold the pool), keep this one
	 * off it.
	 */
	if (multi != NULL && idle_connection_has_input())
	{
		elog(DEBUG1, "etcd: a kept-alive connection received bytes between requests; its connections are not used again");
		etcd_http_forget_connections();
		fresh = (multi != NULL);
	}
	drop_pool_if_idle();
	ensure_multi();

	req = calloc(1, sizeof(EtcdHttpReq));
	if (req == NULL)
		return NULL;
	req->next = live_reqs;
	if (live_reqs)
		live_reqs->prev = req;
	live_reqs = req;

	req->body = strdup(body);
	req->easy = curl_easy_init();
	if (req->body == NULL || req->easy == NULL)
	{
		free_req(req);
		return NULL;
	}

	if (!set_headers(req, auth_token))
	{
		free_req(req);
		return NULL;
	}
	set_options(req, url, timeout_ms, connect_timeout_ms, fresh);
	mc = curl_multi_add_handle(multi, req->easy);
	if (mc != CURLM_OK)
	{
		free_req(req);
		return NULL;
	}
	return req;
}

/*
 * Move finished transfers' results into their requests; returns how many
 * finished.
 */
static int
collect_done(void)
{
	CURLMsg    *msg;
	int			left;
	int			ndone = 0;

	while ((msg = curl_multi_info_read(multi, &left)) != NULL)
	{
		EtcdHttpReq *req = NULL;

		if (msg->msg != CURLMSG_DONE)
			continue;
		curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **) &req);
		if (req == NULL)
			continue;
		req->done = true;
		req->result = msg->data.result;
		curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE,
						  &req->http_code);
		note_connection(msg->easy_handle);
		ndone++;
	}
	return ndone;
}

/*
 * Wait for the latch, postmaster death or libcurl's sockets, for at most
 * timeout ms (-1: no limit).  Returns the number of events.  The wait
 * event set is freed even when the wait raises an error.
 */
static int
wait_on_sockets(long timeout, bool exiting, WaitEvent *events, int nevents)
{
	WaitEventSet *volatile set = NULL;
	volatile int n = 0;
	int			i;

	set = lf_create_wait_event_set(nsocks + 2);
	PG_TRY();
	{
		AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);

		/*
		 * While exiting (revoking our leases), the caller's short deadline
		 * bounds the wait, and the leases are worth revoking even if the
		 * postmaster is gone.
		 */
		if (!exiting)
			AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET,
							  NULL, NULL);
		for (i = 0; i < nsocks; i++)
		{
			uint32		ev = 0;

			if (socks[i].what & CURL_POLL_IN)
				ev |= WL_SOCKET_READABLE;
			if (socks[i].what & CURL_POLL_OUT)
				ev |= WL_SOCKET_WRITEABLE;
			if (ev)
				AddWaitEventToSet(set, ev, socks[i].fd, NULL, NULL);
		}
		n = WaitEventSetWait(set, timeout, events, nevents, PG_WAIT_EXTENSION);
	}
	PG_FINALLY();
	{
		FreeWaitEventSet(set);
	}
	PG_END_TRY();

	return n;
}

/*
 * How long etcd_http_wait may wait: timeout (-1: no limit), shortened to
 * libcurl's timer, and 0 when sockets could not all be watched (libcurl
 * must then be polled).
 */
static long
timeout_within_timer(long timeout)
{
	if (curl_timer_ms >= 0)
	{
		long		elapsed;
		long		left;

		elapsed = (long) ((GetCurrentTimestamp() - curl_timer_set_at) / 1000);
		left = Max(curl_timer_ms - elapsed, 0L);
		if (timeout < 0 || left < timeout)
			timeout = left;
	}
	if (socks_overflow)
		timeout = 0;
	return timeout;
}

/*
 * After a wait: on timer expiry (or when nothing happened), or when
 * sockets could not all be watched, let libcurl handle its timeouts.
 */
static void
run_expired_timer(void)
{
	int			running;

	if (curl_timer_ms >= 0)
	{
		long		elapsed;

		elapsed = (long) ((GetCurrentTimestamp() - curl_timer_set_at) / 1000);
		if (elapsed >= curl_timer_ms)
		{
			curl_timer_ms = -1;
			curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &running);
		}
	}
	if (socks_overflow)
	{
		socks_overflow = false;
		curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &running);
	}
}

/*
 * etcd_http_wait with no request in flight (the connections were dropped
 * since the last one): a plain sleep on the latch, so that a caller
 * pausing between attempts still waits, and serves interrupts, instead of
 * spinning.  Unbounded, nothing would end it: then it returns at once.
 */
static bool
sleep_without_requests(long max_wait_ms, bool exiting)
{
	int			rc;

	if (max_wait_ms < 0)
		return true;
	rc = WaitLatch(MyLatch,
				   WL_LATCH_SET | WL_TIMEOUT |
				   (exiting ? WL_POSTMASTER_DEATH : WL_EXIT_ON_PM_DEATH),
				   max_wait_ms, PG_WAIT_EXTENSION);
	if (rc & WL_LATCH_SET)
	{
		ResetLatch(MyLatch);
		return false;
	}
	return true;
}

/*
 * Wait for network progress, for at most max_wait_ms (-1: until something
 * happens), and let libcurl do its work.  Returns false if the process
 * latch was set (the caller should CHECK_FOR_INTERRUPTS()).
 *
 * Errors are raised only here, outside libcurl.  Postmaster death ends the
 * process, unless it is already exiting.
 */
bool
etcd_http_wait(long max_wait_ms)
{
	WaitEvent	events[ETCD_MAX_SOCKS + 2];
	int			nevents = 0;
	int			running;
	long		timeout = max_wait_ms;
	bool		latch_set = false;
	bool		exiting = proc_exit_inprogress;
	int			i;

	if (multi == NULL)
		return sleep_without_requests(max_wait_ms, exiting);

	/*
	 * First let libcurl start anything that is due.  On loopback this can
	 * complete a whole exchange (connect, send, and read a reply that is
	 * already there): then return at once, as no socket is left to wake the
	 * wait below.
	 */
	if (curl_timer_ms == 0)
	{
		curl_timer_ms = -1;
		curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &running);
		if (collect_done() > 0)
			return true;
	}

	timeout = timeout_within_timer(timeout);
	nevents = wait_on_sockets(timeout, exiting, events, lengthof(events));

	for (i = 0; i < nevents; i++)
	{
		WaitEvent  *ev = &events[i];

		if (ev->events & WL_LATCH_SET)
		{
			ResetLatch(MyLatch);
			latch_set = true;
		}
		else if (ev->events & (WL_SOCKET_READABLE | WL_SOCKET_WRITEABLE))
		{
			int			mask = 0;

			if (ev->events & WL_SOCKET_READABLE)
				mask |= CURL_CSELECT_IN;
			if (ev->events & WL_SOCKET_WRITEABLE)
				mask |= CURL_CSELECT_OUT;
			curl_multi_socket_action(multi, ev->fd, mask, &running);
		}
	}

	run_expired_timer();
	collect_done();

	return !latch_set;
}

/*
 * Where a request stands.
 */
EtcdHttpStatus
etcd_http_status(EtcdHttpReq *req)
{
	if (!req->done)
		return ETCD_HTTP_RUNNING;
	if (req->too_large)
		return ETCD_HTTP_TOO_LARGE;
	switch (req->result)
	{
		case CURLE_OK:
			return ETCD_HTTP_DONE;
		case CURLE_COULDNT_CONNECT:
		case CURLE_COULDNT_RESOLVE_HOST:
		case CURLE_COULDNT_RESOLVE_PROXY:
		case CURLE_SSL_CONNECT_ERROR:
			/* may be a reset during the handshake: worth another try */
			return ETCD_HTTP_CONNECT_FAILED;
		case CURLE_PEER_FAILED_VERIFICATION:
		case CURLE_SSL_CERTPROBLEM:
		case CURLE_SSL_CACERT_BADFILE:
		case CURLE_SSL_CIPHER:
		case CURLE_SSL_ISSUER_ERROR:
		case CURLE_SSL_CRL_BADFILE:
			/* configuration or certificate problems: retrying cannot help */
			return ETCD_HTTP_TLS_FAILED;
		case CURLE_OPERATION_TIMEDOUT:
			return ETCD_HTTP_TIMED_OUT;
		case CURLE_FILESIZE_EXCEEDED:
			return ETCD_HTTP_TOO_LARGE;
		default:
			return ETCD_HTTP_FAILED;
	}
}

/*
 * HTTP status code of a finished request (0 if none arrived).
 */
long
etcd_http_code(EtcdHttpReq *req)
{
	return req->http_code;
}

/*
 * libcurl's description of a failed request, in the caller's memory
 * context.
 */
const char *
etcd_http_error(EtcdHttpReq *req)
{
	if (req->errbuf[0])
		return pstrdup(req->errbuf);
	return pstrdup(curl_easy_strerror(req->result));
}

/*
 * The body the request posted.
 */
const char *
etcd_http_request_body(EtcdHttpReq *req)
{
	return req->body;
}

/*
 * The reply bytes received so far, for a streaming reply (an etcd watch)
 * that the caller reads while the request still runs.  The pointer stays
 * valid until the next etcd_http_wait() or etcd_http_finish().
 */
const char *
etcd_http_peek_body(EtcdHttpReq *req, size_t *len)
{
	*len = req->resp_len;
	return req->resp ? req->resp : "";
}

/*
 * Copy the reply body into palloc'd memory.
 */
char *
etcd_http_take_body(EtcdHttpReq *req, int *len)
{
	char	   *copy = palloc(req->resp_len + 1);

	if (req->resp_len > 0)
		memcpy(copy, req->resp, req->resp_len);
	copy[req->resp_len] = '\0';
	*len = (int) req->resp_len;
	return copy;
}

/*
 * Release a request, finished or not.
 */
void
etcd_http_finish(EtcdHttpReq *req)
{
	if (req)
		free_req(req);
}

/*
 * Release every live request.  Used after errors and at backend exit;
 * never raises an error.
 */
void
etcd_http_abort_all(void)
{
	while (live_reqs)
		free_req(live_reqs);
}
