/*-------------------------------------------------------------------------
 *
 * etcd_floor.c
 *	  The floor for the etcd lock/unlock cycle benchmark: a minimal C client
 *	  outside PostgreSQL, making the fewest etcd gateway requests a fenced
 *	  lock cycle needs, over one kept-alive libcurl connection per holder.
 *
 * One cycle: POST /v3/lease/grant, /v3/lock/lock (waits on the server),
 * /v3/kv/range of the returned key (its create_revision is the fencing
 * token; etcd 3.4 needs this read, see the shared notes), then
 * /v3/lease/revoke, which deletes the key and so releases the lock.
 *
 * Usage: etcd_floor URL NAME HOLDERS START_AT STOP_AT TTL
 *	 START_AT / STOP_AT are CLOCK_MONOTONIC seconds (as Python's
 *	 time.monotonic()).  HOLDERS processes are forked; each loops cycles from
 *	 START_AT until STOP_AT and prints one line per cycle on stdout:
 *	   token acquired released latency	(seconds, CLOCK_MONOTONIC)
 *	 "acquired" is taken when the token is known, "released" just before
 *	 the revoke is sent.  Exit status is non-zero if any holder failed.
 *
 * Build: cc -O2 -o etcd_floor etcd_floor.c $(curl-config --libs)
 *
 * IDENTIFICATION
 *	  bench/etcd_floor.c
 *
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>

#include <curl/curl.h>

typedef struct Buf
{
	char		data[65536];
	size_t		len;
} Buf;

static CURL *easy;
static struct curl_slist *hdrs;
static Buf	reply;
static const char *base_url;

/*
 * Current CLOCK_MONOTONIC time in seconds.
 */
static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/*
 * libcurl write callback: append to the reply buffer (bounded).
 */
static size_t
collect(char *ptr, size_t size, size_t nmemb, void *userdata)
{
	Buf		   *b = userdata;
	size_t		n = size * nmemb;

	if (b->len + n >= sizeof(b->data))
		return 0;
	memcpy(b->data + b->len, ptr, n);
	b->len += n;
	b->data[b->len] = '\0';
	return n;
}

/*
 * POST body to path on the kept-alive handle; exit on any failure.
 */
static const char *
post(const char *path, const char *body)
{
	char		url[512];
	long		code = 0;
	CURLcode	rc;

	snprintf(url, sizeof(url), "%s%s", base_url, path);
	reply.len = 0;
	reply.data[0] = '\0';
	curl_easy_setopt(easy, CURLOPT_URL, url);
	curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body);
	rc = curl_easy_perform(easy);
	curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &code);
	if (rc != CURLE_OK || code != 200)
	{
		fprintf(stderr, "etcd_floor: %s: curl %d, HTTP %ld: %s\n",
				path, (int) rc, code, reply.data);
		exit(1);
	}
	return reply.data;
}

/*
 * Copy the string value of "field":"..." out of a JSON reply.
 */
static int
field(const char *json, const char *name, char *out, size_t outlen)
{
	char		pat[64];
	const char *p;
	const char *e;

	snprintf(pat, sizeof(pat), "\"%s\":\"", name);
	p = strstr(json, pat);
	if (p == NULL)
		return 0;
	p += strlen(pat);
	e = strchr(p, '"');
	if (e == NULL || (size_t) (e - p) >= outlen)
		return 0;
	memcpy(out, p, e - p);
	out[e - p] = '\0';
	return 1;
}

/*
 * Base64 of a short string.
 */
static void
b64(const char *in, char *out)
{
	static const char tbl[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t		n = strlen(in);
	size_t		i;
	char	   *o = out;

	for (i = 0; i < n; i += 3)
	{
		unsigned	v = (unsigned char) in[i] << 16;

		if (i + 1 < n)
			v |= (unsigned char) in[i + 1] << 8;
		if (i + 2 < n)
			v |= (unsigned char) in[i + 2];
		*o++ = tbl[(v >> 18) & 63];
		*o++ = tbl[(v >> 12) & 63];
		*o++ = i + 1 < n ? tbl[(v >> 6) & 63] : '=';
		*o++ = i + 2 < n ? tbl[v & 63] : '=';
	}
	*o = '\0';
}

/*
 * One holder: loop cycles between start_at and stop_at.
 */
static void
holder(const char *name_b64, double start_at, double stop_at, int ttl)
{
	char		body[2048];
	char		lease[64];
	char		key[512];
	char		rev[64];
	char		line[256];

	easy = curl_easy_init();
	hdrs = curl_slist_append(NULL, "Content-Type: application/json");
	hdrs = curl_slist_append(hdrs, "Expect:");
	curl_easy_setopt(easy, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, collect);
	curl_easy_setopt(easy, CURLOPT_WRITEDATA, &reply);
	curl_easy_setopt(easy, CURLOPT_TCP_NODELAY, 1L);
	curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(easy, CURLOPT_TIMEOUT, 60L);

	while (now() < start_at)
		usleep(1000);

	for (;;)
	{
		double		t0 = now();
		double		t_acq;
		double		t_rel;

		if (t0 >= stop_at)
			break;

		snprintf(body, sizeof(body), "{\"TTL\":\"%d\"}", ttl);
		if (!field(post("/v3/lease/grant", body), "ID", lease, sizeof(lease)))
			exit(2);
		snprintf(body, sizeof(body), "{\"name\":\"%s\",\"lease\":\"%s\"}",
				 name_b64, lease);
		if (!field(post("/v3/lock/lock", body), "key", key, sizeof(key)))
			exit(3);
		snprintf(body, sizeof(body), "{\"key\":\"%s\"}", key);
		if (!field(post("/v3/kv/range", body), "create_revision", rev, sizeof(rev)))
		{
			fprintf(stderr, "etcd_floor: lock key vanished: lock lost\n");
			exit(4);
		}
		t_acq = now();
		t_rel = now();
		snprintf(body, sizeof(body), "{\"ID\":\"%s\"}", lease);
		post("/v3/lease/revoke", body);

		/* one write per line: atomic on the shared pipe */
		snprintf(line, sizeof(line), "%s %.6f %.6f %.6f\n",
				 rev, t_acq, t_rel, now() - t0);
		if (write(STDOUT_FILENO, line, strlen(line)) < 0)
			exit(5);
	}
	curl_easy_cleanup(easy);
	curl_slist_free_all(hdrs);
}

int
main(int argc, char **argv)
{
	char		name_b64[1024];
	int			holders;
	double		start_at;
	double		stop_at;
	int			ttl;
	int			i;
	int			failed = 0;

	if (argc != 7 || strlen(argv[2]) > 600)
	{
		fprintf(stderr, "usage: %s URL NAME HOLDERS START_AT STOP_AT TTL\n", argv[0]);
		return 2;
	}
	base_url = argv[1];
	b64(argv[2], name_b64);
	holders = atoi(argv[3]);
	start_at = atof(argv[4]);
	stop_at = atof(argv[5]);
	ttl = atoi(argv[6]);

	curl_global_init(CURL_GLOBAL_ALL);
	for (i = 0; i < holders; i++)
	{
		pid_t		pid = fork();

		if (pid < 0)
		{
			perror("fork");
			return 1;
		}
		if (pid == 0)
		{
			holder(name_b64, start_at, stop_at, ttl);
			_exit(0);
		}
	}
	for (i = 0; i < holders; i++)
	{
		int			st;

		if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			failed = 1;
	}
	return failed;
}
