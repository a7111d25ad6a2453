/*-------------------------------------------------------------------------
 *
 * fuzz_http.c
 *	  Fuzz harness: a whole HTTP answer off the socket, as lockfence sees
 *	  it through libcurl.
 *
 * The input is the byte stream an etcd member sends back: status line,
 * headers, body with Content-Length or chunked framing (the corpus is real
 * etcd answers captured raw).  A request is set up exactly as
 * etcd_http_start() does (set_headers, set_options of etcd_http.c, which
 * is included), against a listener on 127.0.0.1 whose thread sends the
 * input on each connection and ends the stream: libcurl parses the status line, the
 * headers and the framing, lockfence's write callback collects the body
 * (with its size cap), etcd_http_status() classifies the outcome, and a
 * finished answer goes to call_answered() (etcd_client.c, included) as in
 * etcd_call().  Only "malformed reply" (08P01) may be raised.
 *
 * IDENTIFICATION
 *	  fuzz/fuzz_http.c
 *
 *-------------------------------------------------------------------------
 */
#include "fuzz_common.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../src/etcd_http.c"
#include "../src/etcd_client.c"

static const struct
{
	const char *path;
	const char *body;
}			http_requests[] = {
	{"/v3/kv/range", "{\"key\":\"" FUZZ_KEY_B64 "\"}"},
	{"/v3/lease/keepalive", "{\"ID\":\"7587869521853040000\"}"},
	{"/v3/lease/grant", "{\"TTL\":\"30\"}"},
	{"/v3/auth/authenticate", "{\"name\":\"root\",\"password\":\"secret\"}"},
};

/*
 * The "etcd member": a listener on 127.0.0.1 and a thread that answers
 * each connection with the current input, then ends its side of the
 * stream and reads until libcurl closes.  libcurl connects with
 * lockfence's own socket callbacks, as in production.
 */
static int	listen_fd = -1;
static int	listen_port;
static const uint8_t *answer;
static size_t answer_len;
static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int	served;				/* connections answered so far */
static int	dialled;			/* sockets libcurl opened for this input */

static void *
member_thread(void *arg)
{
	for (;;)
	{
		int			fd = accept(listen_fd, NULL, NULL);
		size_t		off = 0;
		char		buf[4096];

		if (fd < 0)
			continue;
		pthread_mutex_lock(&mutex);
		while (off < answer_len)
		{
			ssize_t		n = send(fd, answer + off, answer_len - off, MSG_NOSIGNAL);

			if (n <= 0)
				break;			/* libcurl gave up and closed */
			off += n;
		}
		pthread_mutex_unlock(&mutex);
		shutdown(fd, SHUT_WR);
		while (recv(fd, buf, sizeof(buf), 0) > 0)
			;
		close(fd);
		pthread_mutex_lock(&mutex);
		served++;
		pthread_cond_signal(&cond);
		pthread_mutex_unlock(&mutex);
	}
	return NULL;
}

/*
 * libcurl calls this once it has a socket and is about to connect, which on
 * the loopback interface reaches the listener at once: the member then has
 * that connection to answer.  A transfer can also end before libcurl opens
 * any socket (its timeout passed while the process waited for a CPU, as on
 * a loaded test machine), and then no connection comes.
 */
static int
count_socket(void *clientp, curl_socket_t fd, curlsocktype purpose)
{
	dialled++;
	return CURL_SOCKOPT_OK;
}

static void
start_member(void)
{
	struct sockaddr_in addr;
	socklen_t	len = sizeof(addr);
	pthread_t	th;

	if (listen_fd >= 0)
		return;
	listen_fd = socket(AF_INET, SOCK_STREAM, 0);
	memset(&addr, 0, sizeof(addr));
	addr.sin_family = AF_INET;
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *) &addr, sizeof(addr)) != 0 ||
		listen(listen_fd, 16) != 0 ||
		getsockname(listen_fd, (struct sockaddr *) &addr, &len) != 0 ||
		pthread_create(&th, NULL, member_thread, NULL) != 0)
		abort();
	listen_port = ntohs(addr.sin_port);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	EtcdHttpReq *req;
	int			which = (int) (size % lengthof(http_requests));
	char		url[128];
	EtcdHttpStatus st;
	int			before;

	fuzz_begin();
	start_member();
	pthread_mutex_lock(&mutex);
	answer = data;
	answer_len = size;
	before = served;
	pthread_mutex_unlock(&mutex);

	/* etcd_http_start(), less the multi handle */
	req = calloc(1, sizeof(EtcdHttpReq));
	if (req == NULL)
		abort();
	req->body = strdup(http_requests[which].body);
	req->easy = curl_easy_init();
	if (req->body == NULL || req->easy == NULL ||
		!set_headers(req, (size & 1) ? "DtZSYskdFLFYojsL.16" : NULL))
		abort();
	snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", listen_port,
			 http_requests[which].path);
	set_options(req, url, 5000, 1000, false);
	dialled = 0;
	curl_easy_setopt(req->easy, CURLOPT_SOCKOPTFUNCTION, count_socket);

	/* collect_done() */
	req->result = curl_easy_perform(req->easy);
	req->done = true;
	curl_easy_getinfo(req->easy, CURLINFO_RESPONSE_CODE, &req->http_code);
	curl_easy_cleanup(req->easy);	/* closes the connection */
	req->easy = NULL;

	/*
	 * The member is done with every connection libcurl opened for this
	 * input before the next input replaces it (none if the transfer ended
	 * before connecting: waiting for one would wait for ever).
	 */
	pthread_mutex_lock(&mutex);
	while (served < before + dialled)
		pthread_cond_wait(&cond, &mutex);
	pthread_mutex_unlock(&mutex);

	FUZZ_CHECK(req->resp_len <= ETCD_MAX_REPLY_BYTES);
	FUZZ_CHECK(req->resp == NULL || req->resp[req->resp_len] == '\0');
	st = etcd_http_status(req);
	if (st == ETCD_HTTP_DONE)
	{
		/* exchange() and call_answered() */
		int			len;
		char	   *body = etcd_http_take_body(req, &len);
		long		code = etcd_http_code(req);
		EtcdReply	reply;

		FUZZ_CHECK(len == (int) req->resp_len);
		PG_TRY();
		{
			(void) call_answered(http_requests[which].path,
								 http_requests[which].body, FUZZ_ENDPOINT,
								 body, len, code, true, false, &reply);
		}
		PG_CATCH();
		{
			fuzz_expect_error(ERRCODE_PROTOCOL_VIOLATION);
		}
		PG_END_TRY();
	}
	else
		FUZZ_CHECK(st != ETCD_HTTP_RUNNING && etcd_http_error(req)[0] != '\0');

	free_req(req);
	fuzz_end();
	return 0;
}
