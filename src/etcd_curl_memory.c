/*-------------------------------------------------------------------------
 *
 * etcd_curl_memory.c
 *	  libcurl's memory functions: every block libcurl frees is wiped first.
 *
 * libcurl builds each request in buffers of its own (the request line,
 * the headers with the auth token, and a small body such as the
 * authenticate request's, with the password) and frees them once sent.
 * Freed memory keeps its bytes until it is reused, so without this the
 * password stayed readable in the backend's heap after every
 * authentication (a core dump, /proc/PID/mem).  lockfence wipes its own
 * copies where it drops them (etcd_client.c, etcd_http.c, etcd_guc.c);
 * this covers libcurl's, through curl_global_init_mem().  TLS libraries'
 * own buffers are outside its reach.
 *
 * These run inside libcurl, possibly on its resolver thread: plain malloc
 * and free, never palloc or ereport.  Each block carries its size in a
 * header, so that free and realloc know how much to wipe.
 *
 * IDENTIFICATION
 *	  src/etcd_curl_memory.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <curl/curl.h>

#include "etcd.h"

/*
 * The header in front of each block: its size, padded to malloc's
 * alignment (16 bytes on the 64-bit platforms PostgreSQL supports), so
 * that the pointer handed to libcurl is as aligned as malloc's own.
 */
#define CURL_BLOCK_HEADER	16

StaticAssertDecl(sizeof(size_t) <= CURL_BLOCK_HEADER,
				 "the block header must hold a size_t");

/*
 * Blocks handed out, for etcd_curl_global_init's probe only (read before
 * any other thread of libcurl's runs).
 */
static uint64 blocks_allocated = 0;

static void *
block_alloc(size_t size, bool zero)
{
	char	   *block;

	if (size > SIZE_MAX - CURL_BLOCK_HEADER)
		return NULL;
	block = zero ? calloc(1, size + CURL_BLOCK_HEADER)
		: malloc(size + CURL_BLOCK_HEADER);
	if (block == NULL)
		return NULL;
	memcpy(block, &size, sizeof(size_t));
	blocks_allocated++;
	return block + CURL_BLOCK_HEADER;
}

static size_t
block_size(void *ptr)
{
	size_t		size;

	memcpy(&size, (char *) ptr - CURL_BLOCK_HEADER, sizeof(size_t));
	return size;
}

static void *
wiping_malloc(size_t size)
{
	return block_alloc(size, false);
}

static void
wiping_free(void *ptr)
{
	if (ptr == NULL)
		return;
	explicit_bzero(ptr, block_size(ptr));
	free((char *) ptr - CURL_BLOCK_HEADER);
}

/* a new block and the old one wiped, rather than realloc() moving it unwiped */
static void *
wiping_realloc(void *ptr, size_t size)
{
	void	   *block;

	if (ptr == NULL)
		return block_alloc(size, false);
	block = block_alloc(size, false);
	if (block == NULL)
		return NULL;
	memcpy(block, ptr, Min(size, block_size(ptr)));
	wiping_free(ptr);
	return block;
}

static char *
wiping_strdup(const char *str)
{
	size_t		len = strlen(str) + 1;
	char	   *copy = block_alloc(len, false);

	if (copy != NULL)
		memcpy(copy, str, len);
	return copy;
}

static void *
wiping_calloc(size_t nmemb, size_t size)
{
	if (size != 0 && nmemb > SIZE_MAX / size)
		return NULL;
	return block_alloc(nmemb * size, true);
}

/*
 * curl_global_init() with the functions above; false if it failed.
 * Called once per backend, before lockfence's other libcurl calls
 * (etcd_http.c).  If another component of the backend (another extension,
 * libpq's OAuth support) initialized libcurl first, libcurl keeps the
 * functions it has, and nothing is wiped: a probe allocation tells, and
 * a WARNING says so once.
 */
bool
etcd_curl_global_init(void)
{
	uint64		before = blocks_allocated;
	struct curl_slist *probe;

	if (curl_global_init_mem(CURL_GLOBAL_ALL, wiping_malloc, wiping_free,
							 wiping_realloc, wiping_strdup,
							 wiping_calloc) != CURLE_OK)
		return false;
	probe = curl_slist_append(NULL, "probe");
	if (probe != NULL && blocks_allocated == before)
		ereport(WARNING,
				(errmsg("lockfence cannot wipe libcurl's freed buffers in this backend"),
				 errdetail("Another component of this backend initialized libcurl before lockfence did; libcurl's request buffers, which carry the etcd password and token, are freed without being wiped.")));
	curl_slist_free_all(probe);
	return true;
}
